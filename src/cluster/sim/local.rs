//! A simulated local service: the real membership machine ([`Agent`]) and [`Catalog`], the
//! real single-use rule ([`GrantLedger`]) and grant checks ([`Grant::verify`] with the key
//! its join brought), and a model of its memory: which put's value each page holds. The glue
//! mirrors `agent.rs` (carrying out the machine's actions), `http/handlers/remote.rs`
//! (`grant_put`, `grant_get`, the chain and the commit) and `freed.rs` (`receive`).

use std::collections::{BTreeMap, BTreeSet};

use super::net::{Hop, JoinAsk, Mapped, PushNews, Read, Rep, Req, Verdict};
use super::timing::*;
use super::world::Cx;
use super::{Key, Node, Vid, key_bytes};
use crate::cluster::agent::{Action, Agent, AgentConfig, BeatAnswer, Input, JoinAnswer};
use crate::cluster::catalog::{BeatNews, Catalog, Entry, Freed, Stamp};
use crate::common::medium::Medium;
use crate::common::segment::PAGE_BYTES;
use crate::grant::{Grant, GrantKey, GrantLedger, GrantOp};

enum Call {
    Join {
        meta: String,
    },
    Beat {
        meta: String,
        epoch: u64,
        sent_ms: u64,
        mark: u64,
    },
    Leave,
    /// A hop waiting for the next one, then (first hop) for the commit.
    Forward(Hold),
    Commit(Hold),
    /// An abort sent and not waited for.
    Abort,
}

/// A write under a grant waiting on the chain's next hop or the meta's commit.
struct Hold {
    to: Node,
    call: u64,
    key: Key,
    grant: String,
    g: Grant,
    next: String,
    cataloged: bool,
}

pub(super) struct Local {
    pub incarnation: u64,
    agent: Agent,
    pub catalog: Catalog,
    /// Page → the value written there last.
    pub memory: BTreeMap<u64, Vid>,
    used: GrantLedger,
    grant_key: Option<GrantKey>,
    pending_key: Option<GrantKey>,
    /// The rank this host's memory is mounted under.
    pub rank: Option<u32>,
    meta: Option<Node>,
    pub epoch: u64,
    pub joined: bool,
    pages: u64,
    calls: BTreeMap<u64, (u64, Call)>,
    /// Ranges whose pending entry was dropped after a commit that went unanswered (the meta
    /// may have committed it): tolerated when the end compares catalogs.
    pub unlisted: Vec<(u32, u64, Stamp)>,
    /// A process that recovered blobs joins no earlier than this (`server.rs` `start_agent`:
    /// the heartbeat timeout and a second after its start).
    join_not_before: u64,
    /// Same-host connections holding mapped reads (`shards/grant_reads.rs`), and the last
    /// connection number given.
    mapped: BTreeSet<u64>,
    conns: u64,
}

/// What a dead local service left for the next (`Shape::keeps_catalog`).
pub struct Kept {
    pub entries: Vec<Entry>,
    memory: BTreeMap<u64, Vid>,
    pub in_step: u64,
    heard_by: u64,
}

impl Local {
    pub fn new(incarnation: u64, metas: usize, rank: Option<u32>, pages: u64, now: u64) -> Local {
        let config = AgentConfig {
            meta_urls: (0..metas).map(|i| Node::Meta(i as u8).url()).collect(),
            rank,
            heartbeat_interval_ms: HB_INTERVAL_MS,
            heartbeat_timeout_ms: HB_TIMEOUT_MS,
        };
        Local {
            incarnation,
            agent: Agent::new(config, now),
            catalog: Catalog::default(),
            memory: BTreeMap::new(),
            used: GrantLedger::new(crate::limits::MAX_USED_GRANTS),
            grant_key: None,
            pending_key: None,
            rank: None,
            meta: None,
            epoch: 0,
            joined: false,
            pages,
            calls: BTreeMap::new(),
            unlisted: Vec::new(),
            mapped: BTreeSet::new(),
            conns: 0,
            join_not_before: 0,
        }
    }

    /// What an SSD file and its journal keep of this process when it dies: the committed
    /// entries with their bytes, and the leadership the catalog was in step with.
    pub fn kept(&self) -> Kept {
        let entries = self.catalog.entries();
        let mut memory = BTreeMap::new();
        for e in &entries {
            let first = e.offset / PAGE_BYTES;
            let end = (e.offset + e.size.max(1)).div_ceil(PAGE_BYTES);
            for p in first..end {
                if let Some(v) = self.memory.get(&p) {
                    memory.insert(p, *v);
                }
            }
        }
        Kept {
            entries,
            memory,
            in_step: self.agent.in_step(),
            heard_by: self.agent.heard_by(),
        }
    }

    /// A new process starting at `now` from what its predecessor kept (`shards/local_ssd.rs`).
    pub fn recover(&mut self, kept: Kept, now: u64) {
        if !kept.entries.is_empty() {
            self.join_not_before = now + HB_TIMEOUT_MS + 1000;
        }
        for e in kept.entries {
            self.catalog.add(e);
        }
        self.memory = kept.memory;
        self.agent.recovered_in_step(kept.in_step, kept.heard_by);
    }

    pub fn has_left(&self) -> bool {
        self.agent.has_left()
    }

    /// The keys this process holds bytes of (gone with it when it dies).
    pub fn values(&self) -> Vec<Vid> {
        self.memory.values().copied().collect()
    }

    /// SIGTERM: a graceful stop (the agent leaves).
    pub fn stop(&mut self, cx: &mut Cx) {
        self.step(cx, Input::Stop);
    }

    pub fn tick(&mut self, cx: &mut Cx) {
        for call in super::past_deadline(&self.calls, cx.now) {
            self.on_reply(cx, call, Rep::Unreachable);
        }
        if cx.now < self.join_not_before {
            return;
        }
        self.step(cx, Input::Tick { moved_at_ms: 0 });
    }

    /// One step of the machine, its actions carried out (`agent.rs` `run` and `act`).
    fn step(&mut self, cx: &mut Cx, input: Input) {
        let held = self.catalog.holds_committed();
        let commits = self
            .calls
            .values()
            .any(|(_, c)| matches!(c, Call::Commit(_)));
        self.agent.set_commits_in_flight(commits);
        for action in self.agent.step(input, cx.now, held) {
            self.act(cx, action);
        }
    }

    fn act(&mut self, cx: &mut Cx, action: Action) {
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
                self.grant_key = None;
                self.joined = false;
                if !cx.mutations.keep_mapped_reads_at_join {
                    self.mapped.clear();
                }
                let to = Node::from_url(&meta).expect("a simulated meta");
                let req = Req::Join(JoinAsk {
                    incarnation: self.incarnation,
                    rank,
                    rank_configured,
                    catalog_follows,
                    in_step,
                    catalog_since,
                    recovered,
                    heard_by,
                    bytes: self.pages * PAGE_BYTES,
                });
                let call = cx.request(to, req);
                self.calls
                    .insert(call, (cx.now + CALL_TIMEOUT_MS, Call::Join { meta }));
            }
            Action::ResetAcks => self.catalog.reset_ack(),
            Action::Become { meta, rank, epoch } => {
                if self.rank.is_some_and(|r| r != rank) {
                    // A new rank replaces the memory: the meta forgot the old copies.
                    self.discard(cx, "mounted under another rank");
                    self.memory.clear();
                }
                self.rank = Some(rank);
                if let Some(key) = self.pending_key.take() {
                    self.grant_key = Some(key);
                }
                self.meta = Node::from_url(&meta);
                self.epoch = epoch;
                self.joined = true;
            }
            Action::DiscardCatalog => self.discard(cx, "catalog discarded"),
            Action::DropUnconfirmed => {
                let n = self.catalog.drop_unconfirmed();
                if n > 0 {
                    cx.log(format!("{n} unconfirmed catalog entries dropped"));
                }
            }
            // No SSD file in the model: a restarted service starts empty, so nothing records it.
            Action::InStep { .. } => {}
            Action::Beat {
                meta,
                rank,
                epoch,
                hand_over,
            } => {
                let to = Node::from_url(&meta).expect("a simulated meta");
                let (ack, mark) = (self.catalog.acked(), self.catalog.mark());
                let req = Req::Beat {
                    rank,
                    incarnation: self.incarnation,
                    epoch,
                    ack,
                    catalog: hand_over.then(|| self.catalog.entries()),
                };
                let call = cx.request(to, req);
                let c = Call::Beat {
                    meta,
                    epoch,
                    sent_ms: cx.now,
                    mark,
                };
                self.calls.insert(call, (cx.now + CALL_TIMEOUT_MS, c));
            }
            Action::Leave { meta, rank, epoch } => {
                let to = Node::from_url(&meta).expect("a simulated meta");
                let req = Req::Leave {
                    rank,
                    incarnation: self.incarnation,
                    epoch,
                };
                let call = cx.request(to, req);
                self.calls
                    .insert(call, (cx.now + LEAVE_TIMEOUT_MS, Call::Leave));
            }
            Action::Exit(why) => cx.log(format!("exits ({why:?})")),
            Action::Warn(m) | Action::Info(m) => cx.log(m),
        }
    }

    /// Drops the catalog without handing it over: its objects are lost by a documented rule,
    /// those whose commit answer is still on its way included (seed 4329: a put committed on
    /// the meta, its answer slowed past the catalog's drop).
    fn discard(&mut self, cx: &mut Cx, why: &str) {
        for e in self.catalog.entries() {
            if let Some(k) = super::key_of(&e.key) {
                cx.ledger.excuse(k, cx.now);
            }
        }
        for v in self.values() {
            if let Some(k) = cx.ledger.key_of(v) {
                cx.ledger.excuse(k, cx.now);
            }
        }
        cx.log(format!("{why}: {} entries", self.catalog.len()));
        self.catalog.clear();
    }

    pub fn handle(&mut self, cx: &mut Cx, from: Node, call: u64, req: Req) {
        let rep = match req {
            Req::Write {
                key,
                val,
                grant,
                next,
            } => match self.write(cx, from, call, key, val, grant, next) {
                Some(v) => Rep::Done(v),
                None => return,
            },
            Req::Read { key, grant, map } => match map.then(|| self.map(cx, key, &grant)) {
                Some(Some(m)) => Rep::Mapped(m),
                _ => Rep::Bytes(self.read(cx, key, &grant)),
            },
            Req::Push { epoch, news, mac } => Rep::Pushed(self.receive(epoch, news, &mac)),
            _ => Rep::Done(Verdict::Failed),
        };
        cx.reply(from, call, rep);
    }

    /// `remote.rs` `check` and `granted_segment`: the grant, then the segment it names.
    fn check(&self, cx: &Cx, key: Key, text: &str, next: &str, write: bool) -> Option<Grant> {
        let gk = self.grant_key.as_ref()?;
        let g = Grant::verify(gk, text, &key_bytes(key), next.as_bytes(), cx.wall).ok()?;
        if g.op == GrantOp::Move || g.op.is_write() != write {
            return None;
        }
        let inside = g
            .offset
            .checked_add(g.len)
            .is_some_and(|end| end <= self.pages * PAGE_BYTES);
        (self.rank == Some(g.rank) && g.medium == Medium::Dram as u8 && inside).then_some(g)
    }

    /// `remote.rs` `grant_put`: `None` when the answer comes later (the chain, the commit).
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        cx: &mut Cx,
        from: Node,
        call: u64,
        key: Key,
        val: Vid,
        grant: String,
        next: Option<Hop>,
    ) -> Option<Verdict> {
        let next_url = next.as_ref().map_or(String::new(), |h| h.url(key));
        let Some(g) = self.check(cx, key, &grant, &next_url, true) else {
            return Some(Verdict::Failed);
        };
        if self.used.admit(&grant, &g, cx.wall).is_err() {
            if !cx.mutations.reusable_grants {
                return Some(Verdict::Failed);
            }
            cx.log(format!(
                "MUTATION reusable_grants: a used grant writes k{key} = {val} again at {}",
                g.offset
            ));
        }
        if g.op == GrantOp::Write
            && self
                .catalog
                .freed_before(Medium::Dram, g.offset, stamp(&g), g.floor)
        {
            cx.log(format!(
                "refused a late write of k{key} at {}: its blob was freed before it arrived",
                g.offset
            ));
            return Some(Verdict::Failed);
        }
        let first = g.offset / PAGE_BYTES;
        let end = (g.offset + g.size.max(1)).div_ceil(PAGE_BYTES);
        for p in first..end {
            self.memory.insert(p, val);
        }
        if g.op == GrantOp::WriteCommit {
            cx.ledger.wrote(&grant, val);
        }
        cx.log(format!(
            "wrote k{key} = {val} at {} ({:?}, stamp {}.{}, epoch {})",
            g.offset,
            g.op,
            super::short_view(g.view),
            g.obj_generation,
            self.epoch
        ));
        let cataloged = self.catalog_add(key, &g);
        let hold = Hold {
            to: from,
            call,
            key,
            grant,
            g,
            next: next_url,
            cataloged,
        };
        if let Some(n) = next {
            let req = Req::Write {
                key,
                val,
                grant: n.grant,
                next: n.next.map(|b| *b),
            };
            let c = cx.request(n.to, req);
            self.calls
                .insert(c, (cx.now + HOP_TIMEOUT_MS, Call::Forward(hold)));
            return None;
        }
        self.after_chain(cx, hold)
    }

    /// Every hop answered: a later hop answers, the first commits.
    fn after_chain(&mut self, cx: &mut Cx, hold: Hold) -> Option<Verdict> {
        if hold.g.op != GrantOp::WriteCommit {
            return Some(Verdict::Ok);
        }
        let Some(meta) = self.meta else {
            self.catalog_drop(&hold);
            return Some(Verdict::Failed);
        };
        let req = Req::Commit {
            key: hold.key,
            grant: hold.grant.clone(),
            next: hold.next.clone(),
            ok: true,
        };
        let c = cx.request(meta, req);
        self.calls
            .insert(c, (cx.now + HOP_TIMEOUT_MS, Call::Commit(hold)));
        None
    }

    /// `remote.rs` `catalog_add`.
    fn catalog_add(&mut self, key: Key, g: &Grant) -> bool {
        let entry = Entry::written(&key_bytes(key), Medium::Dram, g.offset, g.size, stamp(g));
        if g.op == GrantOp::WriteCommit {
            self.catalog.add_pending(entry);
        } else if g.floor > 0 {
            self.catalog.add_copy(entry, g.floor);
        } else {
            self.catalog.add(entry);
        }
        true
    }

    fn catalog_drop(&mut self, hold: &Hold) {
        if hold.cataloged {
            self.catalog.free(&freed(&hold.g));
        }
    }

    /// `remote.rs` `grant_get`.
    fn read(&self, cx: &Cx, key: Key, text: &str) -> Read {
        match self.check(cx, key, text, "", false) {
            Some(g) => self.peek(g.offset, g.size),
            None => Read::Refused,
        }
    }

    /// `conn/same_host.rs` `map`: a read answered with where its bytes are, while its grant
    /// has `MAPPED_GRANT_MIN_LEFT_MS` left; the connection holds it until the client copied.
    fn map(&mut self, cx: &Cx, key: Key, text: &str) -> Option<Mapped> {
        let g = self.check(cx, key, text, "", false)?;
        if g.expires_ms < cx.wall + crate::limits::MAPPED_GRANT_MIN_LEFT_MS {
            return None;
        }
        self.conns += 1;
        self.mapped.insert(self.conns);
        let Node::Local(local) = cx.me else {
            unreachable!("a local service's handler")
        };
        Some(Mapped {
            local,
            offset: g.offset,
            size: g.size,
            until: g.expires_ms,
            conn: self.conns,
            incarnation: self.incarnation,
        })
    }

    /// A mapped read's copy by its client (after the open-connection check and the clock's):
    /// what it took, or `None` when it counts for nothing (its connection closed: shut down by
    /// a join, or the process is another; or the copy ended at or after `until` by this host's
    /// clock, `wall`).
    pub fn copy_mapped(&mut self, m: &Mapped, wall: u64, check_time: bool) -> Option<Read> {
        // A connection of an earlier process on this service's socket closed when that
        // process died; this one's numbers start over, and one of them named the same was
        // taken for it (the simulation's own defect, found by seed 279801: a client read the
        // restarted process's empty memory through an answer of the dead one).
        let open = m.incarnation == self.incarnation && self.mapped.remove(&m.conn);
        (open && (!check_time || wall < m.until)).then(|| self.peek(m.offset, m.size))
    }

    /// What the memory holds at `offset` for `size` bytes.
    pub fn peek(&self, offset: u64, size: u64) -> Read {
        let first = offset / PAGE_BYTES;
        let end = (offset + size.max(1)).div_ceil(PAGE_BYTES);
        let vals: Vec<Option<&Vid>> = (first..end).map(|p| self.memory.get(&p)).collect();
        match vals[0] {
            None => Read::Empty,
            Some(v) if vals.iter().all(|x| *x == Some(v)) => Read::Val(*v),
            Some(_) => Read::Torn,
        }
    }

    /// `freed.rs` `receive`.
    fn receive(&mut self, epoch: u64, news: PushNews, mac: &str) -> Option<u64> {
        let key = self.grant_key.as_ref()?;
        if !key.verify_body(&news.body(epoch), mac.as_bytes()) {
            return None;
        }
        if epoch != self.epoch || !self.joined {
            return None;
        }
        let mark = self.catalog.mark();
        let news = BeatNews {
            seq: news.seq,
            freed: news.freed,
            resync: None,
        };
        self.catalog.apply(news, mark);
        Some(self.catalog.acked())
    }

    pub fn on_reply(&mut self, cx: &mut Cx, call: u64, rep: Rep) {
        let Some((_, c)) = self.calls.remove(&call) else {
            return;
        };
        match c {
            Call::Join { meta } => {
                let answer = match rep {
                    Rep::Admitted { admission, key } => {
                        self.pending_key = GrantKey::from_hex(&key);
                        JoinAnswer::Admitted(admission)
                    }
                    Rep::NotLeader(Some(leader)) => JoinAnswer::Redirect(leader.url()),
                    Rep::JoinRefused(true) => JoinAnswer::Taken,
                    _ => JoinAnswer::Failed,
                };
                self.step(cx, Input::JoinAnswered { meta, answer });
            }
            Call::Beat {
                meta,
                epoch,
                sent_ms,
                mark,
            } => {
                // An answer to an earlier membership's heartbeat (at this meta or another) is
                // news of a log this service no longer follows.
                if !self.agent.is_membership(&meta, epoch) {
                    return;
                }
                let answer = match rep {
                    Rep::Heard(news) => {
                        self.catalog.apply(news, mark);
                        BeatAnswer::Heard
                    }
                    Rep::Forgotten => BeatAnswer::Forgotten,
                    Rep::NotLeader(_) => BeatAnswer::NotLeader,
                    _ => BeatAnswer::Unheard,
                };
                self.step(cx, Input::BeatAnswered { sent_ms, answer });
            }
            Call::Leave => {
                let ok = matches!(rep, Rep::Left(true));
                self.step(cx, Input::LeaveAnswered { ok });
            }
            Call::Forward(hold) => {
                if matches!(rep, Rep::Done(Verdict::Ok)) {
                    let (to, c) = (hold.to, hold.call);
                    if let Some(v) = self.after_chain(cx, hold) {
                        cx.reply(to, c, Rep::Done(v));
                    }
                } else {
                    // `finish_failed`: the entry goes, the put is aborted with the meta.
                    self.catalog_drop(&hold);
                    self.abort(cx, &hold);
                    cx.reply(hold.to, hold.call, Rep::Done(Verdict::Failed));
                }
            }
            Call::Commit(hold) => {
                let v = match rep {
                    Rep::Done(Verdict::Ok) => {
                        if hold.cataloged && !self.catalog.confirm(&freed(&hold.g)) {
                            // A new membership dropped the entry unconfirmed meanwhile.
                            cx.log(format!(
                                "k{}: committed after its entry was dropped",
                                hold.key
                            ));
                            Verdict::Failed
                        } else {
                            Verdict::Ok
                        }
                    }
                    other => {
                        if !matches!(other, Rep::Done(_)) {
                            // No answer: the meta may have committed it.
                            if let Some(r) = self.rank {
                                self.unlisted.push((r, hold.g.offset, stamp(&hold.g)));
                            }
                        }
                        self.catalog_drop(&hold);
                        Verdict::Failed
                    }
                };
                cx.reply(hold.to, hold.call, Rep::Done(v));
            }
            Call::Abort => {}
        }
    }

    /// `remote.rs` `abort`: a commit with `ok=0`, not waited for here.
    fn abort(&mut self, cx: &mut Cx, hold: &Hold) {
        let (GrantOp::WriteCommit, Some(meta)) = (hold.g.op, self.meta) else {
            return;
        };
        let req = Req::Commit {
            key: hold.key,
            grant: hold.grant.clone(),
            next: hold.next.clone(),
            ok: false,
        };
        let c = cx.request(meta, req);
        self.calls.insert(c, (cx.now + HOP_TIMEOUT_MS, Call::Abort));
    }
}

/// `remote.rs` `grant_stamp`.
fn stamp(g: &Grant) -> Stamp {
    Stamp {
        view: g.view,
        seq: g.obj_generation,
    }
}

/// `remote.rs` `catalog_freed`.
fn freed(g: &Grant) -> Freed {
    Freed {
        medium: Medium::Dram,
        offset: g.offset,
        stamp: stamp(g),
        landed: false,
    }
}
