//! A local service's membership, carried out: the decisions are the pure machine's
//! ([`crate::cluster::agent`]: when to join, report, give a meta up, leave, and whether the
//! catalog may be handed over); this module sends its messages over HTTP, feeds the answers
//! back, and acts on this process (the grant key, the writers under earlier grants, the
//! mounted segments, the catalog).
//!
//! Runs on its own thread with a small monoio runtime; shards never wait for it. Calls run as
//! tasks whose answers the loop hands to the machine every tick, so a heartbeat goes on while
//! a leave waits for its drain. The bytes themselves never pass here: clients bring them to
//! the shards under grants.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::agent::{Action, Admission, Agent, AgentConfig, BeatAnswer, Input, JoinAnswer};
use crate::cluster::catalog::BeatNews;
use crate::grant::GrantKey;
use crate::http::{catalog_wire, client, report_wire};
use crate::metrics::view::Source;
use crate::shards::Shared;
use crate::shards::store::segment::{Medium, segment_name};

/// How long a join or heartbeat waits for the meta service.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a leave waits for its answer: the meta drains this rank's objects to other ranks
/// first (up to 10 s waiting for room, plus the copies), while this service keeps reporting.
/// Below the 20 s the signal thread waits for the leave.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(18);
/// Catalog entries a hand-over carries at most, in one heartbeat (about 100 bytes of JSON each
/// with short keys: well under the meta's default `ock.mmc.http.max_body_bytes` of 64 MB).
const MAX_HANDED_OVER: usize = 400_000;
/// How often the agent looks at its machine's timers and at what its calls brought back.
const TICK: Duration = Duration::from_millis(10);

/// Starts the agent thread of a local service listening at `listen`.
pub fn start(shared: Arc<Shared>, listen: std::net::SocketAddr) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("mmc-agent".into())
        .spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .expect("the agent's runtime starts");
            rt.block_on(run(shared, listen));
        })?;
    Ok(())
}

/// What a call on its way brought back, handed to the loop that steps the machine.
enum Came {
    Join {
        meta: String,
        answer: JoinAnswer,
        /// The grant key and the meta's `view_version` of an admitting answer.
        key: Option<Box<(GrantKey, u64)>>,
        /// Why a join failed (for the machine's warnings).
        why: Option<String>,
    },
    Beat {
        meta: String,
        epoch: u64,
        sent_ms: u64,
        answer: BeatAnswer,
        news: Option<(BeatNews, u64)>,
    },
    Leave {
        ok: bool,
    },
}

type Inbox = Rc<RefCell<Vec<Came>>>;

fn advertise_url(shared: &Shared, listen: std::net::SocketAddr) -> String {
    let configured = &shared.config.cluster.local_advertise_url;
    if configured.is_empty() {
        let scheme = if shared.config.tls.enable {
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
fn lent(shared: &Shared) -> Vec<(Medium, u64)> {
    let store = &shared.config.store;
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
fn ssd_dir(shared: &Shared, rank: u32) -> Option<&str> {
    let dirs = &shared.config.store.ssd_dirs;
    (!dirs.is_empty()).then(|| dirs[rank as usize % dirs.len()].as_str())
}

async fn run(shared: Arc<Shared>, listen: std::net::SocketAddr) {
    let incarnation = incarnation();
    let url = advertise_url(&shared, listen);
    let c = &shared.config.cluster;
    let config = AgentConfig {
        meta_urls: c.meta_urls.clone(),
        rank: c.local_rank,
        heartbeat_interval_ms: c.heartbeat_interval_ms,
        heartbeat_timeout_ms: c.heartbeat_timeout_ms,
    };
    let mut agent = Agent::new(config, shared.clock.now_ms());
    // A catalog recovered with the SSD file says which leadership it was last in step with.
    agent.recovered_in_step(
        shared.membership.local.in_step.load(Ordering::Acquire),
        shared.membership.local.heard_by.load(Ordering::Acquire),
    );
    let inbox: Inbox = Rc::default();
    let mut pending_key: Option<(GrantKey, u64)> = None;
    // Why the last join failed, said with the machine's warning that no meta admitted us.
    let mut last_failure = String::new();
    let mut stop_told = false;
    loop {
        if shared.is_shutting_down() && !shared.membership.local.leaving.load(Ordering::Acquire) {
            return;
        }
        let mut inputs: Vec<Input> = Vec::new();
        for came in inbox.borrow_mut().drain(..) {
            match came {
                Came::Join {
                    meta,
                    answer,
                    key,
                    why,
                } => {
                    pending_key = key.map(|k| *k);
                    if let Some(why) = why {
                        last_failure = format!("; last: the meta service at {meta} {why}");
                    }
                    inputs.push(Input::JoinAnswered { meta, answer });
                }
                Came::Beat {
                    meta,
                    epoch,
                    sent_ms,
                    answer,
                    news,
                } => {
                    // An answer to an earlier membership's heartbeat (at this meta or another)
                    // is news of a log this service no longer follows: dropped.
                    if !agent.is_membership(&meta, epoch) {
                        continue;
                    }
                    if let Some((news, mark)) = news {
                        // The SSD copies it lands or frees are journaled (and on file)
                        // before the next heartbeat acknowledges them (`shards/local_ssd.rs`).
                        let journaled = shared.journal_mark();
                        let mut catalog = shared.membership.local.catalog();
                        shared.journal_catalog(catalog.apply_tracked(news, mark));
                        drop(catalog);
                        shared.journal_settle_blocking(journaled);
                    }
                    inputs.push(Input::BeatAnswered { sent_ms, answer });
                }
                Came::Leave { ok } => inputs.push(Input::LeaveAnswered { ok }),
            }
        }
        if shared.membership.local.leaving.load(Ordering::Acquire) && !stop_told {
            stop_told = true;
            inputs.push(Input::Stop);
        }
        inputs.push(Input::Tick {
            moved_at_ms: shared.membership.local.moved_at_ms.load(Ordering::Relaxed),
        });
        for input in inputs {
            let now = shared.clock.now_ms();
            let held = shared.membership.local.catalog().holds_committed();
            agent.set_commits_in_flight(
                shared
                    .membership
                    .local
                    .commits_in_flight
                    .load(Ordering::Acquire)
                    > 0,
            );
            for action in agent.step(input, now, held) {
                let action = match action {
                    Action::Warn(w) if w.starts_with("no meta service admitted") => {
                        Action::Warn(format!("{w}{last_failure}"))
                    }
                    a => a,
                };
                act(&shared, &url, incarnation, action, &inbox, &mut pending_key);
            }
        }
        if agent.has_left() {
            shared.membership.local.left.store(true, Ordering::Release);
            return;
        }
        monoio::time::sleep(TICK).await;
    }
}

/// Carries out one action of the machine.
fn act(
    shared: &Arc<Shared>,
    url: &str,
    incarnation: u64,
    action: Action,
    inbox: &Inbox,
    pending_key: &mut Option<(GrantKey, u64)>,
) {
    match action {
        Action::Join {
            meta,
            rank,
            rank_configured,
            catalog_follows,
            in_step,
            catalog_since,
            recovered,
            heard_by,
        } => {
            // Grants of the meta left behind are void from now on: none is accepted until the
            // join's answer brings the next meta's key, and bodies still arriving under one
            // stop being written.
            shared.membership.grant_key.clear();
            shared.membership.local.revoke_writers();
            // And same-host clients still copying what they were answered under them find
            // their connections closed after the copy (it counts for nothing): the ranges
            // may be another object's under the next meta's grants.
            let swept = shared.membership.local.grant_reads.sweep();
            if swept > 0 {
                log::info!(
                    "joining: shut down {swept} same-host connections holding mapped reads of the previous membership"
                );
            }
            // Following no meta: `/health` and `/role` say so, `/ready` is 503 (a service that
            // never joined still says `starting`).
            if shared.membership.local.joined() {
                shared.ha.follow(None);
            }
            shared.membership.local.set_joined(false);
            let body = json!({
                "rank": rank,
                "rank_configured": rank_configured,
                "url": url,
                "incarnation": incarnation,
                "segments": lent(shared)
                    .iter()
                    .map(|&(m, size)| json!({"medium": m.upper(), "size": size}))
                    .collect::<Vec<Value>>(),
                "catalog_follows": catalog_follows,
                "in_step": in_step,
                "catalog_since": [catalog_since.view, catalog_since.epoch],
                "recovered": recovered,
                "heard_by": heard_by,
            });
            let (shared, inbox) = (shared.clone(), inbox.clone());
            monoio::spawn(async move {
                let (answer, key, why) = join(&shared, &meta, body).await;
                inbox.borrow_mut().push(Came::Join {
                    meta,
                    answer,
                    key: key.map(Box::new),
                    why,
                });
            });
        }
        Action::ResetAcks => shared.membership.local.catalog().reset_ack(),
        Action::Become { meta, rank, epoch } => {
            if let Err(e) = mount_as(shared, rank) {
                log::error!("cannot mount this host's segments as rank {rank}: {e}");
                std::process::exit(1);
            }
            let view = match pending_key.take() {
                Some((key, view)) => {
                    shared.membership.grant_key.set(key);
                    view
                }
                None => 0,
            };
            // From now on it reports that meta as the leader it follows, and is ready.
            shared.ha.follow(Some((&meta, view)));
            shared.membership.local.set(rank, meta);
            shared.membership.local.set_epoch(epoch);
            shared.membership.local.set_joined(true);
        }
        Action::InStep { view, lineage } => shared.record_in_step(view, lineage),
        Action::DropUnconfirmed => {
            let n = shared.membership.local.catalog().drop_unconfirmed();
            if n > 0 {
                log::info!(
                    "{n} catalog entries awaiting a commit or a landing under the previous membership are dropped (the meta dropped those blobs)"
                );
            }
        }
        Action::DiscardCatalog => {
            let mut catalog = shared.membership.local.catalog();
            shared.journal_catalog(catalog.clear_tracked());
        }
        Action::Beat {
            meta,
            rank,
            epoch,
            hand_over,
        } => {
            let sent_ms = shared.clock.now_ms();
            let (shared, inbox) = (shared.clone(), inbox.clone());
            monoio::spawn(async move {
                let (answer, news) =
                    heartbeat(&shared, &meta, rank, epoch, incarnation, hand_over).await;
                inbox.borrow_mut().push(Came::Beat {
                    meta,
                    epoch,
                    sent_ms,
                    answer,
                    news,
                });
            });
        }
        Action::Leave { meta, rank, epoch } => {
            let (shared, inbox) = (shared.clone(), inbox.clone());
            monoio::spawn(async move {
                let ok = leave(&shared, &meta, rank, epoch, incarnation).await;
                inbox.borrow_mut().push(Came::Leave { ok });
            });
        }
        Action::Exit(Some(why)) => {
            log::error!("{why}");
            // A wrong secret does not fix itself: stop, so the supervisor shows it.
            std::process::exit(1);
        }
        Action::Exit(None) => {}
        Action::Warn(m) => log::warn!("{m}"),
        Action::Info(m) => log::info!("{m}"),
    }
}

/// One join call to `meta`: the answer as the machine reads it, with the grant key and the
/// meta's `view_version` when admitted, or why it failed.
async fn join(
    shared: &Shared,
    meta: &str,
    body: Value,
) -> (JoinAnswer, Option<(GrantKey, u64)>, Option<String>) {
    let failed = |why: String| {
        log::debug!("join {meta}: {why}");
        (JoinAnswer::Failed, None, Some(why))
    };
    let a = match tell(shared, meta, "/cluster/v1/join", body, CALL_TIMEOUT).await {
        Ok(a) => a,
        // A certificate refused on either side does not fix itself, like a wrong secret.
        Err(e) if e.contains(client::UNTRUSTED) => {
            return (
                JoinAnswer::Fatal(format!(
                    "the meta service at {meta} and this local service do not trust each other's TLS certificates (ock.mmc.cluster.tls.ca.path, cert.path): not joining: {e}"
                )),
                None,
                None,
            );
        }
        Err(e) => return failed(format!("cannot be reached: {e}")),
    };
    match a.status {
        200 => {}
        // An HA standby: the leader is where it points.
        307 => {
            return match a.location.as_deref().and_then(base_of) {
                Some(leader) => (JoinAnswer::Redirect(leader), None, None),
                None => failed("answered 307 without a leader's URL".into()),
            };
        }
        401 => {
            return (
                JoinAnswer::Fatal(format!(
                    "the meta service at {meta} refused this local service's cluster token (ock.mmc.cluster.token / MMC_CLUSTER_TOKEN): not joining"
                )),
                None,
                None,
            );
        }
        s => {
            let why = String::from_utf8_lossy(&a.body);
            // The rank asked for is another service's now (`members::TAKEN_BY_ANOTHER`).
            if s == 409 && why.contains(crate::cluster::members::TAKEN_BY_ANOTHER) {
                log::debug!("join {meta}: refused ({s}): {why}");
                return (
                    JoinAnswer::Taken,
                    None,
                    Some(format!("refused the join ({s}): {why}")),
                );
            }
            return failed(format!("refused the join ({s}): {why}"));
        }
    }
    let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
    let rank = v.get("rank").and_then(Value::as_u64).map(|r| r as u32);
    let epoch = v.get("epoch").and_then(Value::as_u64);
    let key = v
        .get("grant_key")
        .and_then(Value::as_str)
        .and_then(GrantKey::from_hex);
    let (Some(rank), Some(epoch), Some(key)) = (rank, epoch, key) else {
        return failed("answered a join without rank, epoch or grant key".into());
    };
    let c = &shared.config.cluster;
    let admission_view = v.get("view_version").and_then(Value::as_u64).unwrap_or(0);
    let ms = |name: &str, default: u64| v.get(name).and_then(Value::as_u64).unwrap_or(default);
    let admission = Admission {
        rank,
        epoch,
        heartbeat_interval_ms: ms("heartbeat_interval_ms", c.heartbeat_interval_ms),
        heartbeat_timeout_ms: ms("heartbeat_timeout_ms", c.heartbeat_timeout_ms),
        ha: v.get("ha").and_then(Value::as_bool).unwrap_or(false),
        view: admission_view,
        lineage: ms("lineage", 0),
        discard_catalog: v.get("discard_catalog").and_then(Value::as_bool) == Some(true),
        // A meta that does not say is taken to have admitted this service afresh.
        fresh: v.get("fresh").and_then(Value::as_bool) != Some(false),
    };
    (
        JoinAnswer::Admitted(admission),
        Some((key, admission_view)),
        None,
    )
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
fn mount_as(shared: &Shared, rank: u32) -> Result<(), String> {
    let table = &shared.segments;
    for s in table.snapshot().iter() {
        if s.rank != rank {
            table.remove(&s.name);
            // Its memory goes with it: nothing it held is this service's any more.
            shared.membership.local.catalog().clear();
        }
    }
    for (medium, size) in lent(shared) {
        if table.find(&segment_name(rank, medium)).is_some() {
            continue;
        }
        let seg = crate::shards::store::mount::build_segment(
            table,
            rank,
            medium,
            size,
            ssd_dir(shared, rank),
            shared.shard_count(),
            shared.config.store.run_bytes,
        )?;
        if shared.config.store.prefault {
            crate::shards::store::mount::prefault_in_background(&seg);
        }
        table.insert(seg)?;
    }
    Ok(())
}

/// The catalog a heartbeat hands over: at most [`MAX_HANDED_OVER`] entries, the newest.
fn catalog_to_hand_over(shared: &Shared) -> Vec<Value> {
    let mut entries = shared.membership.local.catalog().entries();
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

/// One report: how it went, and the catalog news it brought (with the mark taken when it was
/// sent).
async fn heartbeat(
    shared: &Shared,
    meta: &str,
    rank: u32,
    epoch: u64,
    incarnation: u64,
    hand_over: bool,
) -> (BeatAnswer, Option<(BeatNews, u64)>) {
    let client = report_wire::client_json(&(shared as &dyn Source).recorded_client_views(), rank);
    let (ack, mark) = {
        let c = shared.membership.local.catalog();
        (c.acked(), c.mark())
    };
    let mut body = json!({
        "rank": rank,
        "incarnation": incarnation,
        "epoch": epoch,
        "client": client,
        "catalog_ack": ack,
    });
    // The SSD file's figures, for the meta's per-disk series and its fault state.
    let window = shared.config.metrics.window_secs.max(1);
    let now_secs = shared.clock.now_secs();
    for seg in shared.segments.snapshot().iter() {
        if let Some(f) = seg.backend.file() {
            let (read, written) = f.window_bytes(now_secs, window);
            body["ssd_path"] = json!(f.dir);
            body["ssd_status"] = json!(f.status());
            body["ssd_read_bps"] = json!(read / window);
            body["ssd_write_bps"] = json!(written / window);
        }
    }
    if hand_over {
        body["catalog"] = Value::Array(catalog_to_hand_over(shared));
    }
    match tell(shared, meta, "/cluster/v1/heartbeat", body, CALL_TIMEOUT).await {
        Ok(a) if a.status == 200 => {
            // The blobs the meta freed since the last acknowledged sequence.
            let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
            let news = catalog_wire::parse_news(&v).map(|n| (n, mark));
            (BeatAnswer::Heard, news)
        }
        // The catalog does not fit the meta's body limit: it is not handed over (the meta
        // takes the next, plain heartbeat as an empty catalog; this memory is reused).
        Ok(a) if a.status == 413 && hand_over => (BeatAnswer::CatalogTooLarge, None),
        Ok(a) if a.status == 409 => (BeatAnswer::Forgotten, None),
        Ok(a) if a.status == 307 || a.status == 503 => (BeatAnswer::NotLeader, None),
        Ok(a) => {
            log::warn!("heartbeat refused by {meta} ({})", a.status);
            (BeatAnswer::Unheard, None)
        }
        Err(e) => {
            log::warn!("heartbeat: {e}");
            (BeatAnswer::Unheard, None)
        }
    }
}

async fn leave(shared: &Shared, meta: &str, rank: u32, epoch: u64, incarnation: u64) -> bool {
    let body = json!({"rank": rank, "incarnation": incarnation, "epoch": epoch});
    match tell(shared, meta, "/cluster/v1/leave", body, LEAVE_TIMEOUT).await {
        Ok(a) if a.status == 200 => true,
        Ok(a) => {
            log::warn!("leave refused by {meta} ({})", a.status);
            false
        }
        Err(e) => {
            log::warn!("leave: {e}");
            false
        }
    }
}

/// POSTs a JSON message to the meta at `meta` with the cluster token.
async fn tell(
    shared: &Shared,
    meta: &str,
    path: &str,
    body: Value,
    timeout: Duration,
) -> Result<client::Answer, String> {
    let token = shared.config.cluster.token.as_str();
    let body = body.to_string().into_bytes();
    client::request(meta, "POST", path, Some(token), body, timeout).await
}

/// This run of the service: its start time and a random part (`cluster::members::incarnation`),
/// telling it from a previous run with the same rank, and later than it.
fn incarnation() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let random = xxhash_rust::xxh3::xxh3_64(
        &(since.as_nanos() ^ ((std::process::id() as u128) << 64)).to_le_bytes(),
    );
    crate::cluster::members::incarnation(since.as_millis() as u64, random)
}
