//! The faults the simulation injects (`world.rs`): pauses, kills, restarts, partitions and
//! slow links, failovers, etcd outages, clock jumps, and the workload's client operations.

use super::super::client::Ask;
use super::super::timing::*;
use super::super::{Key, Node};
use super::*;

impl World {
    pub(super) fn inject(&mut self) {
        let r = self.rng.below(1000);
        // A calm run skips three faults in four (`Shape::calm`).
        if self.shape.calm && (350..=380).contains(&r) && self.rng.below(4) != 0 {
            return;
        }
        match r {
            0..=349 => self.client_op(),
            350..=354 => self.partition(false),
            355..=358 => self.partition(true),
            359..=361 => {
                let j = self.rng.below(self.locals.len() as u64) as usize;
                if self.locals[j].running(self.now) {
                    let ms = 50 + self.rng.below(5000);
                    self.locals[j].paused_until = self.now + ms;
                    self.counts.pauses += 1;
                    self.trace
                        .log(self.now, format!("local {j} paused for {ms} ms"));
                }
            }
            362..=363 => {
                let j = self.rng.below(self.locals.len() as u64) as usize;
                if self.locals[j].proc.is_some() {
                    self.counts.kills += 1;
                    self.trace.log(self.now, format!("local {j} killed"));
                    self.exit_local(j);
                    if r == 363 {
                        self.locals[j].down_until = Some(self.now + 1);
                    }
                }
            }
            364 => {
                let j = self.rng.below(self.locals.len() as u64) as usize;
                if self.locals[j].running(self.now) {
                    self.counts.leaves += 1;
                    self.trace
                        .log(self.now, format!("local {j}: SIGTERM (leaves)"));
                    let mut cx = cx!(self, Node::Local(j as u8), self.locals[j].offset);
                    self.locals[j].proc.as_mut().expect("running").stop(&mut cx);
                    self.flush();
                    if self.rng.chance(40) {
                        self.locals[j].kill_at = Some(self.now + self.rng.below(300));
                    }
                }
            }
            365..=366 => {
                let n = self.metas.len() + self.locals.len();
                let x = self.rng.below(n as u64) as usize;
                let offset = self.rng.below(2 * MAX_OFFSET_MS as u64 + 1) as i64 - MAX_OFFSET_MS;
                self.counts.clock_jumps += 1;
                let who = if x < self.metas.len() {
                    self.metas[x].offset = offset;
                    format!("meta {x}")
                } else {
                    self.locals[x - self.metas.len()].offset = offset;
                    format!("local {}", x - self.metas.len())
                };
                self.trace
                    .log(self.now, format!("{who}'s wall clock set to {offset:+} ms"));
            }
            367..=374 => {
                let c = self.rng.below(self.clients.len() as u64) as usize;
                let pick = self.rng.next();
                if self.clients[c].idle() {
                    let mut cx = cx!(self, Node::Client(c as u8), 0);
                    if self.clients[c].replay(&mut cx, pick) {
                        self.counts.grant_replays += 1;
                    }
                    self.flush();
                }
            }
            375 if self.metas.len() > 1 => {
                let ms = 500 + self.rng.below(8000);
                self.etcd.out_until = self.now + ms;
                self.counts.etcd_outages += 1;
                self.trace.log(self.now, format!("etcd out for {ms} ms"));
            }
            376 => {
                let i = self.rng.below(self.metas.len() as u64) as usize;
                if self.metas[i].running(self.now) {
                    let ms = 100 + self.rng.below(6000);
                    self.pause_meta(i, ms, "");
                }
            }
            378..=379 => self.restart_behind_a_slow_link(),
            380 if self.metas.len() > 1 && self.churn.is_none() => {
                // Leadership churn: the next leaders are frozen past their lease one after
                // another, each soon after it serves (a leader that resumes finds another
                // leading, and may lead again later).
                let n = 2 + self.rng.below(3) as u8;
                self.churn = Some(Churn { left: n, at: None });
                self.counts.churns += 1;
                self.trace.log(
                    self.now,
                    format!("leadership churn: the next {n} leaders freeze"),
                );
            }
            377 => {
                let i = self.rng.below(self.metas.len() as u64) as usize;
                if self.metas[i].proc.is_some() {
                    self.metas[i].proc = None;
                    self.metas[i].inbox.clear();
                    self.metas[i].paused_until = 0;
                    self.metas[i].down_until = Some(self.now + 100 + self.rng.below(4000));
                    self.counts.meta_kills += 1;
                    self.trace.log(self.now, format!("meta {i} killed"));
                }
            }
            _ => {}
        }
    }

    /// Meta `i` frozen (SIGSTOP) for `ms`; `who` qualifies it in the trace.
    fn pause_meta(&mut self, i: usize, ms: u64, who: &str) {
        self.metas[i].paused_until = self.now + ms;
        self.metas[i].woke = true;
        self.counts.meta_pauses += 1;
        self.trace
            .log(self.now, format!("meta {i}{who} paused for {ms} ms"));
    }

    /// Leadership churn ([`Churn`]): the serving leader is frozen past its lease some
    /// 1–6 s after it was first seen serving.
    pub(super) fn churn_step(&mut self) {
        let Some(mut c) = self.churn else {
            return;
        };
        let Some(i) = self.leader().filter(|&i| self.metas[i].running(self.now)) else {
            return;
        };
        match c.at {
            None => c.at = Some((i, self.now + 1000 + self.rng.below(5000))),
            Some((j, at)) if j != i => c.at = Some((i, at.max(self.now + 300))),
            Some((_, at)) if at <= self.now => {
                let ms = HA_TTL_MS + self.rng.below(3000);
                self.pause_meta(i, ms, " (the leader)");
                c.left -= 1;
                c.at = None;
            }
            Some(_) => {}
        }
        self.churn = (c.left > 0).then_some(c);
    }

    /// A local service killed (sometimes while it leaves) and started again at once while its
    /// link to the metas crawls: what the dead process sent last (a heartbeat, its leave)
    /// may arrive after its successor joined.
    pub(super) fn restart_behind_a_slow_link(&mut self) {
        let j = self.rng.below(self.locals.len() as u64) as usize;
        if !self.locals[j].running(self.now) {
            return;
        }
        let ms = 500 + self.rng.below(2500);
        for i in 0..self.metas.len() {
            self.net
                .slow_down(Node::Local(j as u8), Node::Meta(i as u8), self.now + ms);
        }
        self.counts.slow_links += 1;
        if self.rng.chance(50) {
            self.counts.leaves += 1;
            let mut cx = cx!(self, Node::Local(j as u8), self.locals[j].offset);
            self.locals[j].proc.as_mut().expect("running").stop(&mut cx);
            self.flush();
        }
        self.locals[j].kill_at = Some(self.now + 50 + self.rng.below(250));
        self.trace.log(
            self.now,
            format!("local {j}: its link to the metas crawls for {ms} ms; it is killed soon"),
        );
    }

    pub(super) fn client_op(&mut self) {
        let c = self.rng.below(self.clients.len() as u64) as usize;
        if !self.clients[c].idle() {
            return;
        }
        let key = self.rng.below(KEYS as u64) as Key;
        let ask = match self.rng.below(100) {
            0..=39 => Ask::Put {
                key,
                pages: 1 + self.rng.below(3),
                replicas: 1 + self.rng.chance(30) as u8,
            },
            40..=74 => Ask::Get { key },
            75..=91 => Ask::Delete { keys: vec![key] },
            _ => {
                let n = 2 + self.rng.below(2);
                let mut keys: Vec<Key> =
                    (0..n).map(|_| self.rng.below(KEYS as u64) as Key).collect();
                keys.sort_unstable();
                keys.dedup();
                Ask::Delete { keys }
            }
        };
        let pick = self.rng.next();
        let mut cx = cx!(self, Node::Client(c as u8), 0);
        self.clients[c].start(&mut cx, ask, pick);
        self.flush();
    }

    /// Cuts a node off from another, or from every other (`slow`: a slow link instead).
    pub(super) fn partition(&mut self, slow: bool) {
        let mut nodes: Vec<Node> = (0..self.metas.len())
            .map(|i| Node::Meta(i as u8))
            .chain((0..self.locals.len()).map(|j| Node::Local(j as u8)))
            .chain((0..self.clients.len()).map(|c| Node::Client(c as u8)))
            .collect();
        if self.metas.len() > 1 {
            nodes.push(Node::Etcd);
        }
        let ms = 100 + self.rng.below(4000);
        let a = nodes[self.rng.below(nodes.len() as u64) as usize];
        let others: Vec<Node> = if self.rng.chance(30) {
            nodes.iter().copied().filter(|&n| n != a).collect()
        } else {
            let b = nodes[self.rng.below(nodes.len() as u64) as usize];
            if a == b {
                return;
            }
            vec![b]
        };
        for &b in &others {
            if slow {
                self.net.slow_down(a, b, self.now + ms);
            } else {
                self.net.cut(a, b, self.now + ms);
            }
        }
        let what = if slow {
            self.counts.slow_links += 1;
            "slow link"
        } else {
            self.counts.partitions += 1;
            "partition"
        };
        self.trace.log(
            self.now,
            format!("{what}: {a:?} from {others:?} for {ms} ms"),
        );
    }
}
