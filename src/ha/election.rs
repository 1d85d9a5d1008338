//! The election thread: campaigns for the election key with an etcd lease, keeps the lease
//! alive while it leads, follows the leader while it does not, and publishes every change to
//! the [`HaView`](super::HaView).
//!
//! - **Campaign**: grant a lease, then one transaction "create `<prefix>leader` = my advertise
//!   URL, attached to the lease, if it does not exist". Exactly one campaigner succeeds; the
//!   key's create revision (etcd's global revision, which only grows) is the `view_version`
//!   and the fence of that leadership.
//! - **Lead**: renew the lease every TTL/3. Each renewal is sent at `t0`; etcd's lease then
//!   lives until at least `t0 + TTL` (it counts from when it processed the renewal, which is
//!   later). The leader stops serving at `t0 + TTL - margin` when no later renewal succeeded,
//!   so it has stepped down before the lease can expire and another node can win. A renewal
//!   is a request with that deadline: a frozen etcd (SIGSTOP) is noticed as surely as a dead
//!   one. After a renewal the key is read back; a key that is not this leadership's any more
//!   also ends it.
//! - **Follow**: read the election key every poll interval (TTL/4, at most 1 s); when it is
//!   gone, campaign. A follower that cannot read it for a TTL reports `unknown` (its view of
//!   the leader is stale).
//! - **Become leader**: `starting` (not serving) while the epoch steps run (the KV-event
//!   epoch), the `/metadata` entries are loaded from etcd into the shards and the recovery
//!   steps run, then `serving`.
//! - **Stop** (SIGTERM): a leader revokes its lease, so a standby takes over at its next poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use super::HaHost;
use super::etcd::{self, Etcd, EtcdError, b64};
use super::{Acks, HaSnapshot, HaState, Role, ShardMsg, run_steps};
use crate::cluster::election::{self, Election, KeyRead, Next, Renewal, Seen, Then, Won};
use crate::common::clock::Clock;
use crate::config::HaConfig;

/// Entries read per `/metadata` page when a new leader loads them.
const LOAD_PAGE: u64 = 1000;

/// The running HA threads (election and `/metadata` writer).
pub struct HaThreads {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl HaThreads {
    /// Starts the election and the writer (HA on only).
    pub fn start(host: Arc<dyn HaHost>) -> Result<HaThreads, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let c = host.clone();
        let s = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("mmc-ha-election".into())
                .spawn(move || Elector::new(c, s).run())
                .map_err(|e| format!("cannot start the HA election thread: {e}"))?,
        );
        let s = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("mmc-ha-writer".into())
                .spawn(move || super::writer::run(host, s))
                .map_err(|e| format!("cannot start the HA writer thread: {e}"))?,
        );
        Ok(HaThreads { stop, threads })
    }

    /// Stops both threads (after the shards: the writer answers what they queued). The
    /// election has already resigned when the shutdown began.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

struct Elector {
    host: Arc<dyn HaHost>,
    cfg: HaConfig,
    key: Vec<u8>,
    etcd: Etcd,
    stop: Arc<AtomicBool>,
    ttl: Duration,
    poll: Duration,
    /// The clock the election's milliseconds count in.
    clock: Clock,
    /// The election's decisions (`cluster::election`): this thread carries them out against
    /// etcd and reports what etcd said.
    election: Election,
    /// The largest view_version seen (kept while the leader is unknown, when the view
    /// published reports 0: `HaView::publish`).
    view_version: u64,
    /// This process's incarnation, written to `<prefix>last_leader` at each election.
    incarnation: String,
    /// The value of `<prefix>kv_events` this node writes when it wins (KV events on): where
    /// routers subscribe to its publisher (`kv_events::leadership`).
    kv_events: Option<String>,
}

/// A value no other process writes: this process's id and start time, hashed with its
/// address space layout.
fn incarnation() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let local = 0u8;
    let seed = format!("{}-{nanos}-{:p}", std::process::id(), &local);
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()))
}

impl Elector {
    fn new(host: Arc<dyn HaHost>, stop: Arc<AtomicBool>) -> Elector {
        let cfg = host
            .ha()
            .config()
            .expect("the election runs with HA on")
            .clone();
        let ttl = Duration::from_secs(cfg.lease_ttl_secs());
        let ttl_ms = ttl.as_millis() as u64;
        let poll = Duration::from_millis(election::poll_ms(ttl_ms));
        let clock = Clock::start();
        Elector {
            key: cfg.election_key(),
            etcd: Etcd::new(cfg.etcd_endpoints.clone()),
            cfg,
            stop,
            ttl,
            poll,
            election: Election::new(ttl_ms, poll.as_millis() as u64, clock.now_ms()),
            clock,
            view_version: 0,
            incarnation: incarnation(),
            kv_events: crate::kv_events::leadership::etcd_value(host.config()),
            host,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Until when this leadership may serve, as an instant (a deadline for the calls it
    /// makes); now when not leading.
    fn deadline(&self) -> Instant {
        self.clock
            .instant_at(self.election.serve_until().unwrap_or_else(|| self.now_ms()))
    }

    /// The server is shutting down (a leader then resigns at once, so a standby takes over
    /// while this node drains), or the threads are being stopped.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.host.shutting_down()
    }

    /// Sleeps until `until_ms` or the stop, in short steps.
    fn sleep_until(&self, until_ms: u64) {
        while !self.stopping() {
            let now = self.now_ms();
            if now >= until_ms {
                return;
            }
            std::thread::sleep(Duration::from_millis((until_ms - now).min(20)));
        }
    }

    fn publish(&mut self, role: Role, state: HaState, leader: Option<String>, view: u64) {
        self.view_version = self.view_version.max(view);
        let fence = match (role, state) {
            (Role::Leader, _) => view as i64,
            _ => 0,
        };
        self.host.ha().publish(
            HaSnapshot {
                role,
                state,
                leader_address: leader,
                view_version: self.view_version,
            },
            fence,
        );
    }

    fn run(mut self) {
        log::info!(
            "HA: campaigning on etcd {} for {} as {} (lease TTL {} s)",
            self.cfg
                .etcd_endpoints
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(","),
            String::from_utf8_lossy(&self.key),
            self.cfg.advertise_url,
            self.ttl.as_secs()
        );
        while !self.stopping() {
            match self.election.next(self.now_ms()) {
                Next::Wait { until_ms } => self.sleep_until(until_ms),
                Next::Look => self.look(),
                Next::Renew { lease } => {
                    if let Err(why) = self.renew(lease) {
                        self.step_down(&why);
                    }
                }
                Next::StepDown => self.step_down("could not renew the lease within its TTL"),
            }
        }
        self.resign("shutting down");
    }

    /// One look at the election key; campaigns when it is free.
    fn look(&mut self) {
        let deadline = Instant::now() + (self.ttl / 2).max(self.poll);
        let (seen, kv, err) = match self.etcd.range(&self.key, None, 0, deadline) {
            Ok(v) => match v.get("kvs").and_then(|k| k.get(0)) {
                None => (Seen::Free, Value::Null, None),
                Some(kv) => {
                    let view = etcd::int(kv, "create_revision").max(0) as u64;
                    (Seen::Held { view }, kv.clone(), None)
                }
            },
            Err(e) => (Seen::Unreachable, Value::Null, Some(e)),
        };
        match self.election.looked(seen, self.now_ms()) {
            Then::Campaign => self.campaign(),
            Then::Follow { .. } => self.follow_leader(&kv),
            Then::Blind { unknown } => self.blind(unknown, err.as_ref()),
        }
    }

    /// etcd was not reached; `unknown`: not for a TTL, so the leader is unknown now.
    fn blind(&mut self, unknown: bool, e: Option<&EtcdError>) {
        let e = e.map_or_else(|| "etcd did not answer".to_string(), |e| e.to_string());
        if unknown {
            let was = self.host.ha().snapshot();
            if was.role != Role::Unknown || was.state != HaState::Unknown {
                log::warn!("HA: {e}; the leader is unknown");
            }
            self.publish(Role::Unknown, HaState::Unknown, None, 0);
        } else {
            log::debug!("HA: {e}");
        }
    }

    /// Follows the leader named by the election key's `kv`.
    fn follow_leader(&mut self, kv: &Value) {
        let url = String::from_utf8_lossy(&etcd::bytes(kv, "value")).into_owned();
        let view = etcd::int(kv, "create_revision").max(0) as u64;
        // Our own URL under a lease we do not hold: a previous life of this node (killed, or
        // stepped down while cut off) whose lease has not expired yet. Not a leader to send
        // clients to; it goes away with its lease.
        let leader = (url != self.cfg.advertise_url).then_some(url);
        self.publish(Role::Standby, HaState::Standby, leader, view);
    }

    /// Grants a lease and tries to create the election key with it; won, takes the
    /// leadership.
    fn campaign(&mut self) {
        let sent = self.now_ms();
        let deadline = self.clock.instant_at(sent) + self.ttl / 2;
        let (lease, granted) = match self.etcd.grant(self.ttl.as_secs(), deadline) {
            Ok(g) => g,
            Err(e) => {
                let then = self.election.lost(None, self.now_ms());
                self.after_lost(then, &Value::Null, Some(&e));
                return;
            }
        };
        let key = b64(&self.key);
        let last = b64(&self.cfg.last_leader_key());
        let mut success = vec![
            json!({"request_range": {"key": last}}),
            json!({"request_put": {
                "key": key,
                "value": b64(self.cfg.advertise_url.as_bytes()),
                "lease": lease.to_string(),
            }}),
            json!({"request_put": {"key": last, "value": b64(self.incarnation.as_bytes())}}),
        ];
        // The KV-event publisher's key: same transaction, same lease, same revision.
        if let Some(value) = &self.kv_events {
            success.push(json!({"request_put": {
                "key": b64(&self.cfg.kv_events_key()),
                "value": b64(value.as_bytes()),
                "lease": lease.to_string(),
            }}));
        }
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": success,
            "failure": [{"request_range": {"key": key}}],
        });
        match self.etcd.txn(&txn, deadline) {
            Ok(v) if v.get("succeeded").and_then(Value::as_bool) == Some(true) => {
                let revision = etcd::int(v.get("header").unwrap_or(&Value::Null), "revision");
                log::info!("HA: elected leader, view_version {revision}");
                let previous = v
                    .pointer("/responses/0/response_range/kvs/0")
                    .map(|kv| etcd::bytes(kv, "value"))
                    .unwrap_or_default();
                let won = self.election.won(
                    lease,
                    sent,
                    granted.max(1) * 1000,
                    revision.max(0) as u64,
                    previous == self.incarnation.as_bytes(),
                );
                self.host
                    .ha()
                    .serve_until(self.clock.instant_at(won.serve_until_ms));
                self.become_leader(won);
            }
            Ok(v) => {
                let kv = v
                    .pointer("/responses/0/response_range/kvs/0")
                    .cloned()
                    .unwrap_or(Value::Null);
                self.revoke_quietly(lease);
                // A null key: taken and gone again between the two steps; the next look
                // campaigns.
                let view = etcd::int(&kv, "create_revision").max(0) as u64;
                let then = self.election.lost(Some(view), self.now_ms());
                self.after_lost(then, &kv, None);
            }
            Err(e) => {
                // The key may or may not have been created: a lease we do not renew ends
                // either way, and with it any key it holds.
                self.revoke_quietly(lease);
                let then = self.election.lost(None, self.now_ms());
                self.after_lost(then, &Value::Null, Some(&e));
            }
        }
    }

    fn after_lost(&mut self, then: Then, kv: &Value, e: Option<&EtcdError>) {
        match then {
            Then::Follow { .. } if !kv.is_null() => self.follow_leader(kv),
            Then::Blind { unknown } => self.blind(unknown, e),
            _ => {}
        }
    }

    fn revoke_quietly(&mut self, lease: i64) {
        let deadline = Instant::now() + Duration::from_millis(500);
        if let Err(e) = self.etcd.revoke(lease, deadline) {
            log::debug!("HA: revoking lease {lease:x}: {e}");
        }
    }

    /// Won: `starting` while the `/metadata` entries are loaded, then `serving` (its span
    /// recorded: what clients wait on in a failover).
    fn become_leader(&mut self, won: Won) {
        let start = Instant::now();
        let ok = self.take_leadership(won);
        self.host.failover_span(start.elapsed(), ok, won.view);
    }

    fn take_leadership(&mut self, won: Won) -> bool {
        let view = won.view;
        let me = Some(self.cfg.advertise_url.clone());
        self.publish(Role::Leader, HaState::Starting, me.clone(), view);
        if won.purge {
            log::warn!(
                "HA: another leader served since this node last led: dropping the objects it still holds (they may be stale)"
            );
            if let Err(e) = self.purge_objects() {
                log::warn!("HA: {e}; resigning");
                self.resign("the purge failed");
                return false;
            }
        }
        // Before anything of this leadership changes the store: the KV-event epoch begins,
        // with what this node holds re-announced (`kv_events::leadership`).
        if let Err(e) = run_steps(&self.host.ha().epoch_steps, view, self.deadline()) {
            log::warn!("HA: {e}; resigning");
            self.resign("the KV-event epoch could not start");
            return false;
        }
        let loaded = self.load_metadata().and_then(|n| {
            run_steps(&self.host.ha().recovery, view, self.deadline())?;
            Ok(n)
        });
        let n = match loaded {
            Ok(n) => n,
            Err(e) => {
                log::warn!("HA: cannot recover the leader's state ({e}); resigning");
                self.resign("the load failed");
                return false;
            }
        };
        log::info!("HA: loaded {n} /metadata entries from etcd");
        if self.election.renewal_due(self.now_ms())
            && let Some(lease) = self.election.lease()
            && let Err(why) = self.renew(lease)
        {
            self.step_down(&why);
            return false;
        }
        if !self.election.serving(self.now_ms()) {
            self.step_down("recovering took past the lease deadline");
            return false;
        }
        self.publish(Role::Leader, HaState::Serving, me, view);
        true
    }

    /// Drops every object this node's shards hold (a purge in slices, as `DELETE /all_keys`).
    fn purge_objects(&self) -> Result<(), String> {
        self.host.ha().ask_every_shard(
            |ack| ShardMsg::Purge { ack },
            self.deadline(),
            "the shards did not drop their objects in time",
        )
    }

    /// Replaces every shard's `/metadata` copy with etcd's, page by page, renewing the lease
    /// between pages when due.
    fn load_metadata(&mut self) -> Result<usize, String> {
        let host = self.host.clone();
        let ha = host.ha();
        let shards = ha.shard_count();
        let mut acks = Acks::new();
        for s in 0..shards {
            acks.send(ha, s, |ack| ShardMsg::Reset { ack });
        }
        let prefix = self.cfg.metadata_prefix();
        let end = etcd::prefix_end(&prefix);
        let mut from = prefix.clone();
        let mut loaded = 0;
        loop {
            if self.election.renewal_due(self.now_ms())
                && let Some(lease) = self.election.lease()
            {
                self.renew(lease)
                    .map_err(|e| format!("lease renewal: {e}"))?;
            }
            let v = self
                .etcd
                .range(&from, Some(&end), LOAD_PAGE, self.deadline())
                .map_err(|e| e.to_string())?;
            let kvs = v.get("kvs").and_then(Value::as_array);
            let mut per_shard: Vec<Vec<(Box<[u8]>, Bytes)>> = vec![Vec::new(); shards];
            let mut last = None;
            for kv in kvs.into_iter().flatten() {
                let full = etcd::bytes(kv, "key");
                let key: Box<[u8]> = full[prefix.len()..].into();
                let owner = host.owner_shard(&key);
                per_shard[owner].push((key, Bytes::from(etcd::bytes(kv, "value"))));
                loaded += 1;
                last = Some(full);
            }
            for (s, entries) in per_shard.into_iter().enumerate() {
                if !entries.is_empty() {
                    acks.send(ha, s, |ack| ShardMsg::Load { entries, ack });
                }
            }
            let more = v.get("more").and_then(Value::as_bool) == Some(true);
            match last {
                Some(mut k) if more => {
                    k.push(0);
                    from = k;
                }
                _ => break,
            }
        }
        acks.wait(
            self.deadline(),
            "the shards did not take the entries in time",
        )?;
        Ok(loaded)
    }

    /// Renews the lease once, then reads the election key back. `Err`: the leadership is
    /// over (lease gone or key not ours); a renewal that merely failed is `Ok` and leaves the
    /// serving deadline as it was.
    fn renew(&mut self, lease: i64) -> Result<(), String> {
        let sent = self.now_ms();
        let r = match self.etcd.keep_alive(lease, self.deadline()) {
            Ok(0) => Renewal::Expired,
            Ok(ttl) => Renewal::Renewed {
                ttl_ms: ttl.saturating_mul(1000),
            },
            Err(e) => {
                log::warn!("HA: lease renewal failed: {e}");
                Renewal::Failed
            }
        };
        self.election.renewal(r, sent, self.now_ms())?;
        if r == Renewal::Failed {
            return Ok(());
        }
        self.host.ha().serve_until(self.deadline());
        // The key must still be this leadership's (nobody deleted or replaced it).
        let read = match self.etcd.range(&self.key, None, 0, self.deadline()) {
            Ok(v) => match v.get("kvs").and_then(|k| k.get(0)) {
                Some(kv)
                    if etcd::int(kv, "create_revision").max(0) as u64 == self.election.view() =>
                {
                    KeyRead::Ours
                }
                _ => KeyRead::NotOurs,
            },
            Err(e) => {
                log::warn!("HA: reading the election key failed: {e}");
                KeyRead::Unreadable
            }
        };
        Ok(self.election.key_read(read)?)
    }

    /// Stops serving at once (before the lease can expire), then lets the lease go.
    fn step_down(&mut self, why: &str) {
        if let Some(end) = self.election.step_down(self.now_ms()) {
            log::warn!("HA: stepping down as leader: {why}");
            self.publish(Role::Unknown, HaState::Unknown, None, end.view);
            self.revoke_quietly(end.lease);
        }
    }

    /// Gives the leadership up (shutting down, or taking it failed), if it leads.
    fn resign(&mut self, why: &str) {
        if let Some(end) = self.election.resign(self.now_ms()) {
            log::info!("HA: resigning as leader ({why})");
            self.publish(Role::Unknown, HaState::Unknown, None, end.view);
            self.revoke_quietly(end.lease);
        }
    }
}
