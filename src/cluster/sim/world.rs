//! The simulated world: its nodes, the network between them, etcd, one clock, and the steps
//! that move them. A step may inject a client operation or a fault, then moves time 1–20 ms:
//! the messages due are delivered in order, then every running node ticks. The checks run
//! after every step; [`World::settle`] heals everything at the end, lets the cluster come to
//! rest and checks what it then holds.

use std::collections::BTreeMap;

use super::check::{Ledger, Outcome};
use super::client::Client;
use super::ha::{Elected, Etcd};
use super::local::{Kept, Local};
use super::meta::Meta;
use super::net::{Envelope, Msg, Net, Read, Rep, Req, Weather};
use super::timing::*;
use super::{Counts, Flags, Mutations, Node, Rng, Shape, Trace, key_bytes};
use crate::shards::store::GetStep;

/// The true time's Unix origin (hosts' wall clocks read it plus their offset).
pub(super) const UNIX_BASE_MS: u64 = 1_700_000_000_000;
/// Keys of the workload (few, so operations on one key meet).
const KEYS: u16 = 12;

/// What a node handler may do besides changing its own state: send, and tell the ledger.
pub(super) struct Cx<'a> {
    pub now: u64,
    /// This host's wall clock (grants' expiries).
    pub wall: u64,
    pub me: Node,
    pub mutations: Mutations,
    out: &'a mut Vec<Envelope>,
    next_call: &'a mut u64,
    pub ledger: &'a mut Ledger,
    pub counts: &'a mut Counts,
    trace: &'a mut Trace,
}

impl Cx<'_> {
    pub fn request(&mut self, to: Node, req: Req) -> u64 {
        *self.next_call += 1;
        let call = *self.next_call;
        let msg = Msg::Req { call, req };
        self.out.push(Envelope {
            from: self.me,
            to,
            msg,
            dup: false,
        });
        call
    }

    pub fn reply(&mut self, to: Node, call: u64, rep: Rep) {
        let msg = Msg::Rep { call, rep };
        self.out.push(Envelope {
            from: self.me,
            to,
            msg,
            dup: false,
        });
    }

    pub fn log(&mut self, line: String) {
        self.trace.log(self.now, format!("{:?}: {line}", self.me));
    }
}

/// A host and the process running on it.
struct Host<P> {
    proc: Option<P>,
    /// SIGSTOPped until then: nothing is handled, messages wait.
    paused_until: u64,
    inbox: Vec<Envelope>,
    /// Down (killed, or gone after a leave) until then, when a new process starts.
    down_until: Option<u64>,
    /// Its wall clock's offset from the true time.
    offset: i64,
    /// A supervisor kills it then (and starts it again at once): a SIGTERMed process that
    /// did not get to finish its leave.
    kill_at: Option<u64>,
    /// What a local service that died left for its next process (`Shape::keeps_catalog`).
    kept: Option<Kept>,
    /// A pause ended and the process has not been stepped since: its threads wake in no
    /// particular order (a meta's shards may tick before its election thread notices the
    /// lease is gone).
    woke: bool,
    /// A meta's election looks again only then: the call to etcd it was making when it froze
    /// is still waiting for its answer (or its timeout), while its shards tick on.
    elect_at: u64,
}

impl<P> Host<P> {
    fn new(proc: P) -> Host<P> {
        Host {
            proc: Some(proc),
            paused_until: 0,
            inbox: Vec::new(),
            down_until: None,
            offset: 0,
            kill_at: None,
            kept: None,
            woke: false,
            elect_at: 0,
        }
    }

    fn running(&self, now: u64) -> bool {
        self.proc.is_some() && self.paused_until <= now
    }
}

pub(super) struct World {
    pub rng: Rng,
    pub now: u64,
    pub steps: u64,
    pub shape: Shape,
    mutations: Mutations,
    net: Net,
    etcd: Etcd,
    metas: Vec<Host<Meta>>,
    locals: Vec<Host<Local>>,
    ranks: Vec<Option<u32>>,
    clients: Vec<Client>,
    ledger: Ledger,
    pub counts: Counts,
    pub trace: Trace,
    next_call: u64,
    out: Vec<Envelope>,
    /// Who served each view (meta, incarnation), and the last leadership that served.
    views: BTreeMap<u64, (usize, u64)>,
    serving: Option<(usize, u64, u64)>,
    problems: Vec<String>,
    churn: Option<Churn>,
}

/// Leadership churn under way: `left` more leaders are frozen past their lease, the one
/// serving now (meta, when) once `at` comes.
#[derive(Clone, Copy)]
struct Churn {
    left: u8,
    at: Option<(usize, u64)>,
}

macro_rules! cx {
    ($w:ident, $me:expr, $offset:expr) => {
        Cx {
            now: $w.now,
            wall: (UNIX_BASE_MS + $w.now).saturating_add_signed($offset),
            me: $me,
            mutations: $w.mutations,
            out: &mut $w.out,
            next_call: &mut $w.next_call,
            ledger: &mut $w.ledger,
            counts: &mut $w.counts,
            trace: &mut $w.trace,
        }
    };
}

impl World {
    /// The world of `seed`; `metas`: that many metas instead of the seed's choice; `flags`:
    /// the rest of its `Shape`.
    pub fn new(seed: u64, mutations: Mutations, metas: Option<usize>, flags: Flags) -> World {
        let mut rng = Rng(seed);
        let drawn = 1 + rng.below(3) as usize;
        let shape = Shape {
            metas: metas.unwrap_or(drawn),
            locals: 2 + rng.below(3) as usize,
            clients: 2 + rng.below(2) as usize,
            seg_pages: [32, 64, 128][rng.below(3) as usize],
            keeps_catalog: flags.keeps_catalog,
            calm: flags.calm,
            mapped_reads: flags.mapped_reads,
            auto_ranks: flags.auto_ranks,
        };
        let mut net = Net::default();
        if !rng.chance(15) {
            net.weather = Some(Weather {
                drop: rng.below(30),
                dup: rng.below(30),
                slow: rng.below(60),
                slow_ms: 50 + rng.below(2500),
            });
        }
        // Configured ranks (`local_rank`), unless `auto_ranks` lets some services take the
        // lowest free one.
        let ranks: Vec<Option<u32>> = (0..shape.locals)
            .map(|j| (!shape.auto_ranks || rng.chance(50)).then_some(j as u32 + 1))
            .collect();
        let mut w = World {
            rng,
            now: 0,
            steps: 0,
            shape,
            mutations,
            net,
            etcd: Etcd::default(),
            metas: Vec::new(),
            locals: Vec::new(),
            ranks,
            clients: (0..shape.clients)
                .map(|_| Client::new(shape.metas, shape.mapped_reads))
                .collect(),
            ledger: Ledger::new(),
            counts: Counts::default(),
            trace: Trace::new(
                std::env::var("MMC_SIM_TRACE")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(400),
            ),
            next_call: 0,
            out: Vec::new(),
            views: BTreeMap::new(),
            serving: None,
            problems: Vec::new(),
            churn: None,
        };
        for _ in 0..shape.metas {
            let m = w.new_meta();
            w.metas.push(Host::new(m));
        }
        for j in 0..shape.locals {
            let l = w.new_local(j);
            w.locals.push(Host::new(l));
        }
        w.trace
            .log(0, format!("seed {seed}: {shape:?}, {:?}", w.net.weather));
        w
    }

    fn incarnation(&mut self) -> u64 {
        self.rng.next() & ((1 << 53) - 1)
    }

    fn new_meta(&mut self) -> Meta {
        let incarnation = self.incarnation();
        let mut master = [0u8; 32];
        for chunk in master.chunks_mut(8) {
            chunk.copy_from_slice(&self.rng.next().to_le_bytes());
        }
        Meta::new(incarnation, master, self.shape.metas > 1, KEYS, self.now)
    }

    fn new_local(&mut self, j: usize) -> Local {
        // `agent.rs`: the start time on the host's wall clock, and a random part.
        let wall = (UNIX_BASE_MS + self.now)
            .saturating_add_signed(self.locals.get(j).map_or(0, |h| h.offset));
        let random = self.incarnation();
        // The mutation: every run seems to start at the same time, so none is older.
        let started = if self.mutations.unordered_incarnations {
            UNIX_BASE_MS
        } else {
            wall
        };
        let incarnation = crate::cluster::members::incarnation(started, random);
        let (metas, pages) = (self.shape.metas, self.shape.seg_pages);
        let mut l = Local::new(incarnation, metas, self.ranks[j], pages, self.now);
        if let Some(kept) = self.locals.get_mut(j).and_then(|h| h.kept.take()) {
            self.trace.log(
                self.now,
                format!(
                    "local {j} recovers {} entries (in step with leadership {})",
                    kept.entries.len(),
                    kept.in_step
                ),
            );
            l.recover(kept, self.now);
        }
        l
    }

    pub fn violations(&self) -> Vec<String> {
        self.problems
            .iter()
            .chain(&self.ledger.violations)
            .cloned()
            .collect()
    }

    /// One step: perhaps an operation or a fault, then 1–20 ms of time.
    pub fn step(&mut self) {
        self.steps += 1;
        self.inject();
        let dt = 1 + self.rng.below(20);
        self.advance(self.now + dt);
    }

    fn advance(&mut self, until: u64) {
        while let Some((at, env)) = self.net.due(until, &mut self.counts) {
            self.now = self.now.max(at);
            self.deliver(env);
        }
        self.now = until;
        self.wake();
        self.tick_all();
        self.check_leaders();
        self.churn_step();
    }

    fn flush(&mut self) {
        for env in std::mem::take(&mut self.out) {
            self.net
                .send(&mut self.rng, self.now, env, &mut self.counts);
        }
    }

    /// A request to a node with no process: connection refused.
    fn refuse(&mut self, env: Envelope) {
        if let Msg::Req { call, .. } = env.msg {
            let msg = Msg::Rep {
                call,
                rep: Rep::Unreachable,
            };
            let back = Envelope {
                from: env.to,
                to: env.from,
                msg,
                dup: false,
            };
            self.net
                .send(&mut self.rng, self.now, back, &mut self.counts);
        }
    }

    fn deliver(&mut self, env: Envelope) {
        let now = self.now;
        match env.to {
            Node::Meta(i) => {
                let i = i as usize;
                if self.metas[i].proc.is_none() {
                    return self.refuse(env);
                }
                if !self.metas[i].running(now) {
                    return self.metas[i].inbox.push(env);
                }
                if let (
                    true,
                    Msg::Req {
                        req: Req::Delete { keys },
                        ..
                    },
                ) = (env.dup, &env.msg)
                {
                    // A removal the network repeated: one more delete, concurrent with
                    // whatever follows, that nobody hears the answer of.
                    for &k in keys {
                        let (op, _) = self.ledger.begin(k, false, now);
                        self.ledger
                            .finish(op, now, Outcome::Unknown, &mut self.counts);
                    }
                }
                let mut cx = cx!(self, env.to, self.metas[i].offset);
                let m = self.metas[i].proc.as_mut().expect("running");
                match env.msg {
                    Msg::Req { call, req } => m.handle(&mut cx, env.from, call, req),
                    Msg::Rep { call, rep } => m.on_reply(&mut cx, call, rep),
                }
            }
            Node::Local(j) => {
                let j = j as usize;
                if self.locals[j].proc.is_none() {
                    return self.refuse(env);
                }
                if !self.locals[j].running(now) {
                    return self.locals[j].inbox.push(env);
                }
                let mut cx = cx!(self, env.to, self.locals[j].offset);
                let l = self.locals[j].proc.as_mut().expect("running");
                match env.msg {
                    Msg::Req { call, req } => l.handle(&mut cx, env.from, call, req),
                    Msg::Rep { call, rep } => l.on_reply(&mut cx, call, rep),
                }
                if l.has_left() {
                    self.exit_local(j);
                }
            }
            Node::Client(c) => {
                let pick = self.rng.next();
                let mut cx = cx!(self, env.to, 0);
                if let Msg::Rep { call, rep } = env.msg {
                    self.clients[c as usize].on_reply(&mut cx, call, rep, pick);
                }
            }
            Node::Etcd => {}
        }
        self.flush();
    }

    /// Paused processes whose pause ended take their waiting messages; hosts whose process
    /// is down start a new one when their time comes.
    fn wake(&mut self) {
        let now = self.now;
        for i in 0..self.metas.len() {
            if self.metas[i].proc.is_none() && self.metas[i].down_until.is_some_and(|t| t <= now) {
                let m = self.new_meta();
                self.trace.log(
                    now,
                    format!("meta {i} starts (incarnation {})", m.incarnation),
                );
                self.metas[i].proc = Some(m);
                self.metas[i].down_until = None;
                self.counts.meta_restarts += 1;
                self.ledger.disrupt(now);
            }
            if self.metas[i].running(now) && !self.metas[i].inbox.is_empty() {
                for env in std::mem::take(&mut self.metas[i].inbox) {
                    self.deliver(env);
                }
            }
        }
        for j in 0..self.locals.len() {
            if self.locals[j].kill_at.is_some_and(|t| t <= now) {
                self.locals[j].kill_at = None;
                self.counts.kills += 1;
                self.trace
                    .log(now, format!("local {j} killed while leaving"));
                self.exit_local(j);
                self.locals[j].down_until = Some(now + 1);
            }
            if self.locals[j].proc.is_none() && self.locals[j].down_until.is_some_and(|t| t <= now)
            {
                let l = self.new_local(j);
                self.trace.log(
                    now,
                    format!("local {j} starts (incarnation {})", l.incarnation),
                );
                self.locals[j].proc = Some(l);
                self.locals[j].down_until = None;
                self.counts.restarts += 1;
            }
            if self.locals[j].running(now) && !self.locals[j].inbox.is_empty() {
                for env in std::mem::take(&mut self.locals[j].inbox) {
                    self.deliver(env);
                }
            }
        }
    }

    fn tick_all(&mut self) {
        let now = self.now;
        for i in 0..self.metas.len() {
            if !self.metas[i].running(now) {
                continue;
            }
            // Just resumed from a pause: the election's call to etcd in flight when it froze
            // answers within 0-2 s; the shards' ticks (declaring silent ranks lost) go on.
            if std::mem::take(&mut self.metas[i].woke) {
                self.metas[i].elect_at = now + self.rng.below(2000);
            }
            if now >= self.metas[i].elect_at {
                self.elect(i);
            }
            let mut cx = cx!(self, Node::Meta(i as u8), self.metas[i].offset);
            if let Some(m) = self.metas[i].proc.as_mut() {
                m.tick(&mut cx);
            }
            self.flush();
            self.record_losses(i);
        }
        for j in 0..self.locals.len() {
            if !self.locals[j].running(now) {
                continue;
            }
            let mut cx = cx!(self, Node::Local(j as u8), self.locals[j].offset);
            let l = self.locals[j].proc.as_mut().expect("running");
            l.tick(&mut cx);
            if l.has_left() {
                self.exit_local(j);
            }
            self.flush();
        }
        for c in 0..self.clients.len() {
            if let Some(m) = self.clients[c].copy_due(now) {
                // A same-host client: the local service's clock, and its memory as it is now
                // (paused or not); nothing if its process is gone.
                let j = m.local as usize;
                let wall = (UNIX_BASE_MS + now).saturating_add_signed(self.locals[j].offset);
                let check_time = !self.mutations.mapped_copy_past_expiry;
                let got = (self.locals[j].proc.as_mut())
                    .and_then(|l| l.copy_mapped(&m, wall, check_time));
                let mut cx = cx!(self, Node::Client(c as u8), 0);
                self.clients[c].copied(&mut cx, got);
            }
            let mut cx = cx!(self, Node::Client(c as u8), 0);
            let again = self.clients[c].tick(&mut cx);
            if let Some(ask) = again
                && self.rng.chance(50)
            {
                self.counts.client_retries += 1;
                let pick = self.rng.next();
                let mut cx = cx!(self, Node::Client(c as u8), 0);
                self.clients[c].start(&mut cx, ask, pick);
            }
            self.flush();
        }
    }

    /// One look of meta `i`'s election, with what etcd answers it now.
    fn elect(&mut self, i: usize) {
        let now = self.now;
        let reach = self.etcd.up(now) && !self.net.is_cut(Node::Meta(i as u8), Node::Etcd, now);
        let Some(m) = self.metas[i].proc.as_mut() else {
            return;
        };
        let incarnation = m.incarnation;
        let Some(e) = m.ha.as_mut() else {
            return;
        };
        match e.step(&mut self.etcd, i as u8, incarnation, reach, now) {
            Elected::Nothing => {}
            Elected::Won { view, purge } => {
                self.trace.log(
                    now,
                    format!("meta {i}: elected leader, view {view} (purge: {purge})"),
                );
                // Before it serves: it records itself, and loads the losses earlier leaders
                // recorded and the leaderships that served (one transaction; the campaign's
                // own answer stands for its reach of etcd).
                self.etcd.served.insert(view);
                if let Some(m) = self.metas[i].proc.as_mut() {
                    m.note_lost(self.etcd.lost.values().copied());
                    m.note_served(self.etcd.served.iter().copied());
                }
                if purge {
                    let mut cx = cx!(self, Node::Meta(i as u8), self.metas[i].offset);
                    if let Some(m) = self.metas[i].proc.as_mut() {
                        m.purge(&mut cx);
                    }
                }
            }
            Elected::SteppedDown(why) => {
                self.trace
                    .log(now, format!("meta {i}: stepped down as leader: {why}"));
            }
        }
    }

    /// At most one meta serves at a time, and a view is one meta process's.
    fn check_leaders(&mut self) {
        let now = self.now;
        let serving: Vec<(usize, u64, u64)> = self
            .metas
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let m = h.proc.as_ref()?;
                let view = m.ha.as_ref().map_or(0, |e| e.view());
                m.serving(now).then_some((i, m.incarnation, view))
            })
            .collect();
        if serving.len() > 1 {
            self.problems
                .push(format!("split brain: {serving:?} serve at once"));
        }
        for &(i, inc, view) in &serving {
            let first = *self.views.entry(view).or_insert((i, inc));
            if first != (i, inc) && self.shape.metas > 1 {
                self.problems.push(format!(
                    "view {view} served by meta {i} (incarnation {inc}) and earlier by {first:?}"
                ));
            }
        }
        // A new leadership (another meta, or the same one elected again) takes the catalogs
        // over again: until they are, objects on local services may read as not found.
        if let Some(&(i, inc, view)) = serving.first()
            && self.serving != Some((i, inc, view))
        {
            if self
                .serving
                .is_some_and(|(j, jinc, _)| (j, jinc) != (i, inc))
            {
                self.counts.failovers += 1;
            }
            self.serving = Some((i, inc, view));
            self.ledger.disrupt(now);
        }
    }

    /// A local service's process ends (killed, or exited after its leave).
    fn exit_local(&mut self, j: usize) {
        let Some(l) = self.locals[j].proc.take() else {
            return;
        };
        for v in l.values() {
            if let Some(k) = self.ledger.key_of(v) {
                self.ledger.excuse(k, self.now);
            }
        }
        for e in l.catalog.entries() {
            if let Some(k) = super::key_of(&e.key) {
                self.ledger.excuse(k, self.now);
            }
        }
        self.locals[j].inbox.clear();
        self.locals[j].paused_until = 0;
        if self.shape.keeps_catalog && self.ranks[j].is_some() {
            self.locals[j].kept = Some(l.kept());
        }
        let back = self.now + 500 + self.rng.below(4000);
        self.locals[j].down_until = Some(back);
        self.trace.log(
            self.now,
            format!("local {j} exits (incarnation {})", l.incarnation),
        );
    }

    /// The end of a run: faults healed, every process running, time for every operation to
    /// end and every allocation to be reclaimed; then the local services' catalogs must be
    /// what the leader holds on their ranks, and every key must read as some history of the
    /// acknowledged operations explains.
    pub fn settle(&mut self) {
        self.trace.log(self.now, "settling: faults healed".into());
        self.net.calm();
        self.net.heal_all();
        self.etcd.out_until = 0;
        let now = self.now;
        for h in &mut self.metas {
            h.paused_until = h.paused_until.min(now);
            if h.proc.is_none() {
                h.down_until = Some(now);
            }
        }
        for h in &mut self.locals {
            h.paused_until = h.paused_until.min(now);
            h.kill_at = None;
            if h.proc.is_none() {
                h.down_until = Some(now);
            }
        }
        let start = self.now;
        while self.now < start + 120_000 {
            self.advance(self.now + 10);
            if !self.violations().is_empty() {
                return;
            }
            if self.now >= start + REMOTE_WRITER_MS + ALLOC_TIMEOUT_MS && self.at_rest() {
                break;
            }
        }
        if !self.at_rest() {
            let why = self.unrest();
            self.problems.push(format!(
                "the cluster did not come to rest within 120 s of healing: {why}"
            ));
            return;
        }
        self.compare_catalogs();
        self.final_reads();
    }

    /// The serving meta, if one serves.
    fn leader(&self) -> Option<usize> {
        let now = self.now;
        (0..self.metas.len()).find(|&i| self.metas[i].proc.as_ref().is_some_and(|m| m.serving(now)))
    }

    /// A leader serves, quiet, and every local service is its member with segments OK.
    fn at_rest(&self) -> bool {
        let Some(i) = self.leader() else {
            return false;
        };
        let m = self.metas[i].proc.as_ref().expect("serving");
        m.quiet()
            && self.clients.iter().all(Client::idle)
            && self.locals.iter().all(|h| {
                h.proc
                    .as_ref()
                    .is_some_and(|l| l.joined && l.rank.is_some_and(|r| m.holds(r, l.epoch)))
            })
    }

    /// Each local service's catalog lists exactly the blobs the leader holds on its rank
    /// (but a put whose commit answer never came: its entry was dropped, the meta may hold
    /// it).
    fn compare_catalogs(&mut self) {
        let i = self.leader().expect("at rest");
        let m = self.metas[i].proc.as_ref().expect("serving");
        for (j, h) in self.locals.iter().enumerate() {
            let l = h.proc.as_ref().expect("at rest");
            let rank = l.rank.expect("at rest");
            let listed: Vec<_> = l
                .catalog
                .entries()
                .into_iter()
                .map(|e| (e.offset, e.stamp, e.key))
                .collect();
            let held: Vec<_> = m
                .rank_blobs(rank)
                .into_iter()
                .map(|e| (e.offset, e.stamp, e.key))
                .collect();
            for e in listed.iter().filter(|e| !held.contains(e)) {
                self.problems.push(format!(
                    "local {j} (rank {rank}) lists {:?} at {} ({:?}), which the leader does not hold there: a failover would bring it back",
                    String::from_utf8_lossy(&e.2),
                    e.0,
                    e.1
                ));
            }
            for e in held.iter().filter(|e| !listed.contains(e)) {
                if l.unlisted.contains(&(rank, e.0, e.1)) {
                    continue;
                }
                self.problems.push(format!(
                    "the leader holds {:?} at rank {rank} offset {} ({:?}), which local {j}'s catalog does not list: a failover would lose it",
                    String::from_utf8_lossy(&e.2),
                    e.0,
                    e.1
                ));
            }
        }
    }

    /// Every key read through the leader and the local service holding its copy.
    fn final_reads(&mut self) {
        let i = self.leader().expect("at rest");
        let now = self.now;
        for k in 0..KEYS {
            let m = self.metas[i].proc.as_mut().expect("serving");
            let got = match m.store.get(&key_bytes(k)) {
                GetStep::Ready(v) => {
                    m.store.unpin(v.handle);
                    let l = self
                        .locals
                        .iter()
                        .filter_map(|h| h.proc.as_ref())
                        .find(|l| l.rank == Some(v.seg.rank));
                    match l {
                        Some(l) => l.peek(v.offset, v.len),
                        None => Read::Empty,
                    }
                }
                GetStep::NotFound => Read::NotFound,
                other => {
                    self.problems
                        .push(format!("k{k}: the settled leader answered {other:?}"));
                    continue;
                }
            };
            self.trace.log(now, format!("final read k{k}: {got:?}"));
            self.ledger.read(k, now, now, got, true, &mut self.counts);
        }
    }
}

// After `cx!`: macros are in scope from their definition on.
mod faults;
mod losses;
