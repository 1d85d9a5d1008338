//! The simulated network: every message between two nodes goes through [`Net::send`], which
//! drops, duplicates, delays and reorders it as the run's weather says, and refuses it while
//! the two are cut off from each other (a partition, in either direction).

use std::collections::BTreeMap;

use super::{Counts, Key, Node, Rng, Vid};
use crate::cluster::agent::Admission;
use crate::cluster::catalog::{BeatNews, Entry, Freed};
use crate::cluster::members::Membership;

/// A request's answer, matched to it by the call id the sender chose.
#[derive(Clone, Debug)]
pub(super) enum Msg {
    Req { call: u64, req: Req },
    Rep { call: u64, rep: Rep },
}

/// One hop of a put's chain: the local service to send the bytes to, and its grant.
#[derive(Clone, Debug)]
pub(super) struct Hop {
    pub to: Node,
    pub grant: String,
    pub next: Option<Box<Hop>>,
}

impl Hop {
    /// The hop's URL as the previous hop's grant covers it (`next` in the MAC).
    pub fn url(&self, key: Key) -> String {
        let mut u = format!(
            "{}/api/v1/objects?key=k{key}&grant={}",
            self.to.url(),
            self.grant
        );
        if let Some(n) = &self.next {
            u.push_str("&next=");
            u.push_str(&n.url(key));
        }
        u
    }
}

/// A join's body (`agent.rs` `act`'s JSON; `members::JoinRequest` says what each means).
#[derive(Clone, Debug)]
pub(super) struct JoinAsk {
    pub incarnation: u64,
    pub rank: Option<u32>,
    pub rank_configured: bool,
    pub catalog_follows: bool,
    pub in_step: u64,
    pub catalog_since: Membership,
    pub recovered: bool,
    pub heard_by: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug)]
pub(super) enum Req {
    // A local service to its meta (`agent.rs`, `remote.rs`).
    Join(JoinAsk),
    Beat {
        rank: u32,
        incarnation: u64,
        epoch: u64,
        ack: u64,
        catalog: Option<Vec<Entry>>,
    },
    Leave {
        rank: u32,
        incarnation: u64,
        epoch: u64,
    },
    Commit {
        key: Key,
        grant: String,
        next: String,
        ok: bool,
    },
    // A meta to a local service: freed records (`freed.rs`), a drain's copy (`copies.rs`).
    Push {
        epoch: u64,
        news: PushNews,
        mac: String,
    },
    // Object requests: a client (or a meta copying) to a local service under a grant, or a
    // hop to the next.
    Write {
        key: Key,
        val: Vid,
        grant: String,
        next: Option<Hop>,
    },
    Read {
        key: Key,
        grant: String,
        /// A same-host client asking for a mapped answer (`X-Mmc-Map`).
        map: bool,
    },
    // A client to a meta.
    Put {
        key: Key,
        pages: u64,
        replicas: u8,
    },
    Get {
        key: Key,
    },
    Delete {
        keys: Vec<Key>,
    },
}

/// A push's body, and what its MAC is taken over.
#[derive(Clone, Debug)]
pub(super) struct PushNews {
    pub seq: u64,
    pub freed: Vec<(u64, Freed)>,
}

impl PushNews {
    pub fn body(&self, epoch: u64) -> Vec<u8> {
        format!("{epoch}:{}:{:?}", self.seq, self.freed).into_bytes()
    }
}

/// How a put or a removal ended, as its client hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Ok,
    /// Refused for good: nothing of it took effect (an allocation the meta refused).
    Refused,
    /// An error that says nothing of the effect (a hop, a commit, a timeout, a 503).
    Failed,
    NotFound,
}

#[derive(Clone, Debug)]
pub(super) enum Rep {
    /// The node is down (connection refused).
    Unreachable,
    /// Not the serving leader: the leader's node when known (307), else 503.
    NotLeader(Option<Node>),
    Admitted {
        admission: Admission,
        key: String,
    },
    /// `true`: the rank asked for is another service's (`members::TAKEN_BY_ANOTHER`).
    JoinRefused(bool),
    Heard(BeatNews),
    /// 409: join again.
    Forgotten,
    Left(bool),
    /// The ack of a push (`None`: refused).
    Pushed(Option<u64>),
    /// A put's grants, a read's grant.
    Redirect(Hop),
    Done(Verdict),
    /// Per key of a batch removal (`Verdict::Failed` for all when unconfirmed).
    Removed(Vec<Verdict>),
    Bytes(Read),
    /// A mapped answer (`X-Mmc-Mapped`): the client copies from the local service's memory
    /// itself, later.
    Mapped(Mapped),
}

/// Where a mapped read's blob is, until when the copy counts (the grant's expiry, on the
/// local service's clock, which its same-host client shares), and the connection holding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mapped {
    pub local: u8,
    pub offset: u64,
    pub size: u64,
    pub until: u64,
    /// The connection that holds the answer: its number in the process that answered, and
    /// that process's incarnation (a restarted service numbers its connections afresh, and a
    /// client's connection to the dead process is closed whatever number it had).
    pub conn: u64,
    pub incarnation: u64,
}

/// What a read under a grant found in the local service's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Read {
    Val(Vid),
    /// Pages of different writes (or none written).
    Torn,
    Empty,
    /// Refused (grant, segment).
    Refused,
    NotFound,
}

#[derive(Clone, Debug)]
pub(super) struct Envelope {
    pub from: Node,
    pub to: Node,
    pub msg: Msg,
    /// A copy the network made: nobody waits for what it does.
    pub dup: bool,
}

/// What the run's network does to messages, in per mille of them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Weather {
    pub drop: u64,
    pub dup: u64,
    /// Delayed by up to `slow_ms` (and so reordered with the ones after it).
    pub slow: u64,
    pub slow_ms: u64,
}

#[derive(Default)]
pub(super) struct Net {
    queue: BTreeMap<(u64, u64), Envelope>,
    seq: u64,
    /// Pairs cut off from each other, until when.
    cuts: BTreeMap<(Node, Node), u64>,
    /// Pairs whose messages crawl (a slow link: retransmissions, a stalled proxy), until when.
    slow: BTreeMap<(Node, Node), u64>,
    pub weather: Option<Weather>,
}

fn pair(a: Node, b: Node) -> (Node, Node) {
    if a <= b { (a, b) } else { (b, a) }
}

impl Net {
    pub fn cut(&mut self, a: Node, b: Node, until: u64) {
        let e = self.cuts.entry(pair(a, b)).or_default();
        *e = (*e).max(until);
    }

    pub fn slow_down(&mut self, a: Node, b: Node, until: u64) {
        let e = self.slow.entry(pair(a, b)).or_default();
        *e = (*e).max(until);
    }

    pub fn is_cut(&self, a: Node, b: Node, now: u64) -> bool {
        self.cuts.get(&pair(a, b)).is_some_and(|&u| u > now)
    }

    pub fn heal_all(&mut self) {
        self.cuts.clear();
        self.slow.clear();
    }

    pub fn calm(&mut self) {
        self.weather = None;
    }

    pub fn send(&mut self, rng: &mut Rng, now: u64, env: Envelope, counts: &mut Counts) {
        if self.is_cut(env.from, env.to, now) {
            counts.cut_messages += 1;
            return;
        }
        let w = self.weather;
        let mut delay = 1 + rng.below(4);
        if self
            .slow
            .get(&pair(env.from, env.to))
            .is_some_and(|&u| u > now)
        {
            counts.delays += 1;
            delay += 300 + rng.below(2200);
        }
        if let Some(w) = w {
            if rng.below(1000) < w.drop {
                counts.drops += 1;
                return;
            }
            if rng.below(1000) < w.slow {
                counts.delays += 1;
                delay += rng.below(w.slow_ms);
            }
            if rng.below(1000) < w.dup {
                counts.duplicates += 1;
                let again = now + 1 + rng.below(w.slow_ms.max(10));
                let mut copy = env.clone();
                copy.dup = true;
                self.push(again, copy);
            }
        }
        self.push(now + delay, env);
    }

    fn push(&mut self, at: u64, env: Envelope) {
        self.seq += 1;
        self.queue.insert((at, self.seq), env);
    }

    /// The next message due by `until`, with its time (a message between nodes cut off
    /// when it arrives is lost on the way).
    pub fn due(&mut self, until: u64, counts: &mut Counts) -> Option<(u64, Envelope)> {
        loop {
            let (&(at, seq), _) = self.queue.first_key_value()?;
            if at > until {
                return None;
            }
            let env = self.queue.remove(&(at, seq)).expect("the first entry");
            if self.is_cut(env.from, env.to, at) {
                counts.cut_messages += 1;
                continue;
            }
            return Some((at, env));
        }
    }
}
