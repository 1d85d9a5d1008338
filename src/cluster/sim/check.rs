//! The checker's ledger (Jepsen's lesson): every put and removal a client made, when it was
//! invoked and answered and how; every read is asked whether some history of those
//! operations explains what it found.
//!
//! A put's value is *in effect* from the moment a meta committed it (the simulation sees the
//! commit). A read of key `k` under success must find the value of a put of `k` (else a corrupt
//! read) that no operation acknowledged before the read began had superseded: an acknowledged
//! delete or put of `k` invoked after that value was in effect (else a resurrected delete or a
//! stale overwrite). A read that finds nothing while an acknowledged put must be there (every
//! other write of `k` ended before it began, or was refused) is a loss, unless a documented
//! rule explains it: a copy evicted, a rank lost or left with it, a catalog discarded, a
//! process gone with its memory, a purge of a re-elected leader; during the run also a
//! failover or a meta restart (the catalogs come back as the local services join), but not in
//! the final reads after the cluster settled.

use std::collections::BTreeMap;

use super::net::Read;
use super::{Counts, Key, Vid};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Pending,
    Ok,
    /// Refused before anything took effect.
    Refused,
    /// No answer, or one that does not say whether it took effect.
    Unknown,
}

#[derive(Clone, Debug)]
struct Op {
    key: Key,
    /// The put's value; `None`: a removal.
    val: Option<Vid>,
    invoke: u64,
    done: Option<u64>,
    outcome: Outcome,
    effect_at: Option<u64>,
}

pub(super) struct Ledger {
    ops: Vec<Op>,
    by_vid: BTreeMap<Vid, usize>,
    by_key: BTreeMap<Key, Vec<usize>>,
    /// The values written under each first hop's grant (a commit puts them in effect).
    by_grant: BTreeMap<String, Vec<Vid>>,
    /// Per key, when a documented rule dropped a copy of it.
    excused: BTreeMap<Key, Vec<u64>>,
    /// When the serving leader changed or a meta restarted.
    disrupted: Vec<u64>,
    /// Per key, when a meta applied a removal of it.
    removed: BTreeMap<Key, Vec<u64>>,
    next_vid: Vid,
    pub violations: Vec<String>,
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger {
            ops: Vec::new(),
            by_vid: BTreeMap::new(),
            by_key: BTreeMap::new(),
            by_grant: BTreeMap::new(),
            excused: BTreeMap::new(),
            disrupted: Vec::new(),
            removed: BTreeMap::new(),
            next_vid: 1,
            violations: Vec::new(),
        }
    }

    /// A put (with a fresh value) or a removal of `key` begins.
    pub fn begin(&mut self, key: Key, put: bool, now: u64) -> (usize, Vid) {
        let val = put.then(|| {
            self.next_vid += 1;
            self.next_vid
        });
        let id = self.ops.len();
        self.ops.push(Op {
            key,
            val,
            invoke: now,
            done: None,
            outcome: Outcome::Pending,
            effect_at: None,
        });
        if let Some(v) = val {
            self.by_vid.insert(v, id);
        }
        self.by_key.entry(key).or_default().push(id);
        (id, val.unwrap_or(0))
    }

    /// The operation's first answer (a later one, to a duplicate, changes nothing).
    pub fn finish(&mut self, op: usize, now: u64, outcome: Outcome, counts: &mut Counts) {
        let o = &mut self.ops[op];
        if o.outcome != Outcome::Pending {
            return;
        }
        o.outcome = outcome;
        o.done = Some(now);
        if outcome == Outcome::Ok {
            match o.val {
                Some(_) => counts.puts_acked += 1,
                None => counts.deletes_acked += 1,
            }
        }
    }

    /// The first hop wrote `val` under `grant`.
    pub fn wrote(&mut self, grant: &str, val: Vid) {
        self.by_grant
            .entry(grant.to_string())
            .or_default()
            .push(val);
    }

    /// A meta committed the put of `grant`: what was written under it is in effect.
    pub fn committed(&mut self, grant: &str, now: u64) {
        for v in self.by_grant.get(grant).into_iter().flatten() {
            if let Some(&op) = self.by_vid.get(v) {
                let e = &mut self.ops[op].effect_at;
                *e = Some(e.unwrap_or(now).min(now));
            }
        }
    }

    pub fn excuse(&mut self, key: Key, now: u64) {
        self.excused.entry(key).or_default().push(now);
    }

    /// A meta applied a removal of `key` at `now` (a client's, or a duplicate of one the
    /// network delivered late, which may land after a newer put: it explains a Not Found).
    pub fn removed(&mut self, key: Key, now: u64) {
        self.removed.entry(key).or_default().push(now);
    }

    pub fn disrupt(&mut self, now: u64) {
        self.disrupted.push(now);
    }

    pub fn key_of(&self, val: Vid) -> Option<Key> {
        self.by_vid.get(&val).map(|&op| self.ops[op].key)
    }

    /// A read of `key` begun at `invoke`, answered at `done` with `got`. `strict`: the final
    /// reads, where a failover excuses nothing.
    pub fn read(
        &mut self,
        key: Key,
        invoke: u64,
        done: u64,
        got: Read,
        strict: bool,
        counts: &mut Counts,
    ) {
        match got {
            Read::Val(v) => {
                counts.reads_checked += 1;
                counts.reads_found += 1;
                self.check_value(key, invoke, done, v);
            }
            Read::Torn | Read::Empty => {
                counts.reads_checked += 1;
                self.violations.push(format!(
                    "corrupt read: k{key} answered 200 with {got:?} bytes (read {invoke}..{done})"
                ));
            }
            Read::NotFound => {
                counts.reads_checked += 1;
                self.check_absent(key, invoke, done, strict, counts);
            }
            Read::Refused => {}
        }
    }

    fn check_value(&mut self, key: Key, invoke: u64, done: u64, v: Vid) {
        let Some(&id) = self.by_vid.get(&v) else {
            self.violations.push(format!(
                "corrupt read: k{key} read value {v}, which no put wrote"
            ));
            return;
        };
        let p = self.ops[id].clone();
        if p.key != key {
            self.violations.push(format!(
                "corrupt read: k{key} read value {v}, the bytes of a put of k{} (invoked at {}, {:?})",
                p.key, p.invoke, p.outcome
            ));
            return;
        }
        if p.invoke > done || p.outcome == Outcome::Refused {
            self.violations.push(format!(
                "corrupt read: k{key} read value {v} of a put invoked at {} ({:?}), read {invoke}..{done}",
                p.invoke, p.outcome
            ));
            return;
        }
        let Some(effect) = p.effect_at else {
            return;
        };
        for &x in &self.by_key[&key] {
            let o = &self.ops[x];
            if x == id || o.outcome != Outcome::Ok || o.invoke <= effect {
                continue;
            }
            let acked = o.done.expect("an answered operation");
            if acked < invoke {
                let what = if o.val.is_none() {
                    "resurrected delete"
                } else {
                    "stale overwrite"
                };
                self.violations.push(format!(
                    "{what}: k{key} read value {v} (in effect at {effect}, put invoked at {}) at {invoke}..{done}, after the {} invoked at {} was acknowledged at {acked}",
                    p.invoke,
                    if o.val.is_none() { "delete" } else { "newer put" },
                    o.invoke
                ));
                return;
            }
        }
    }

    fn check_absent(
        &mut self,
        key: Key,
        invoke: u64,
        done: u64,
        strict: bool,
        counts: &mut Counts,
    ) {
        let ops = &self.by_key.get(&key).cloned().unwrap_or_default();
        for &p in ops {
            let o = &self.ops[p];
            let (Some(effect), Some(acked)) = (o.effect_at, o.done) else {
                continue;
            };
            if o.val.is_none() || o.outcome != Outcome::Ok || acked >= invoke {
                continue;
            }
            // Every other write of the key was refused, began after this read ended, or ended
            // before this put began: nothing but this put's value may be there.
            let required = ops.iter().all(|&x| {
                let w = &self.ops[x];
                x == p
                    || w.outcome == Outcome::Refused
                    || w.invoke >= done
                    || w.done.is_some_and(|d| d < o.invoke)
            });
            if !required {
                continue;
            }
            let removed = self
                .removed
                .get(&key)
                .is_some_and(|t| t.iter().any(|&t| t >= effect && t <= done));
            if removed {
                continue;
            }
            let excused = self
                .excused
                .get(&key)
                .is_some_and(|t| t.iter().any(|&t| t >= effect))
                || (!strict && self.disrupted.iter().any(|&t| t >= effect));
            if excused {
                counts.losses_excused += 1;
                continue;
            }
            let history: Vec<String> = ops
                .iter()
                .map(|&x| {
                    let w = &self.ops[x];
                    format!(
                        "{} {}..{:?} {:?}",
                        w.val.map_or("delete".to_string(), |v| format!("put {v}")),
                        w.invoke,
                        w.done,
                        w.outcome
                    )
                })
                .collect();
            self.violations.push(format!(
                "lost: k{key}'s acknowledged put (value {}, in effect at {effect}, acknowledged at {acked}) read Not Found at {invoke}..{done}, and no documented rule dropped it (the key's operations: {})",
                o.val.unwrap_or(0),
                history.join("; ")
            ));
            return;
        }
    }
}
