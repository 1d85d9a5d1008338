//! A simulated client: one operation at a time (a put with 1 or 2 replicas, a get, a delete
//! or batch removal, the replay of a write grant it used before), following redirects to the
//! leader and to the local services, telling the ledger what it invoked and what it heard.

use super::check::Outcome;
use super::net::{Hop, Mapped, Read, Rep, Req, Verdict};
use super::timing::CLIENT_TIMEOUT_MS;
use super::world::Cx;
use super::{Key, Node, Vid};

/// What a client asked for, again (a retry of a timed-out request).
#[derive(Clone, Debug)]
pub(super) enum Ask {
    Put { key: Key, pages: u64, replicas: u8 },
    Get { key: Key },
    Delete { keys: Vec<Key> },
}

enum Kind {
    Put { op: usize, val: Vid },
    Get { invoke: u64 },
    Delete { ops: Vec<usize> },
    Replay { op: usize },
}

struct Op {
    ask: Ask,
    kind: Kind,
    call: u64,
    deadline: u64,
    tries: u8,
    /// Sent to a local service (after a redirect, or a replay).
    at_local: bool,
    /// A mapped answer being copied, and when the copy ends.
    copy: Option<(Mapped, u64)>,
}

pub(super) struct Client {
    metas: u8,
    op: Option<Op>,
    leader: Option<Node>,
    /// The first hops of the latest puts (what a replay sends again).
    pub grants: Vec<(Key, Hop)>,
    /// Asks for mapped answers (`Shape::mapped_reads`).
    mapped: bool,
}

impl Client {
    pub fn new(metas: usize, mapped: bool) -> Client {
        Client {
            metas: metas as u8,
            op: None,
            leader: None,
            grants: Vec::new(),
            mapped,
        }
    }

    pub fn idle(&self) -> bool {
        self.op.is_none()
    }

    fn meta(&self, pick: u64) -> Node {
        self.leader
            .unwrap_or(Node::Meta((pick % self.metas as u64) as u8))
    }

    fn request(ask: &Ask) -> Req {
        match ask.clone() {
            Ask::Put {
                key,
                pages,
                replicas,
            } => Req::Put {
                key,
                pages,
                replicas,
            },
            Ask::Get { key } => Req::Get { key },
            Ask::Delete { keys } => Req::Delete { keys },
        }
    }

    /// Starts `ask` at a meta (the leader it knows, else one picked by `pick`).
    pub fn start(&mut self, cx: &mut Cx, ask: Ask, pick: u64) {
        let kind = match &ask {
            Ask::Put { key, .. } => {
                let (op, val) = cx.ledger.begin(*key, true, cx.now);
                Kind::Put { op, val }
            }
            Ask::Get { .. } => Kind::Get { invoke: cx.now },
            Ask::Delete { keys } => Kind::Delete {
                ops: keys
                    .iter()
                    .map(|&k| cx.ledger.begin(k, false, cx.now).0)
                    .collect(),
            },
        };
        let call = cx.request(self.meta(pick), Client::request(&ask));
        self.op = Some(Op {
            ask,
            kind,
            call,
            deadline: cx.now + CLIENT_TIMEOUT_MS,
            tries: 0,
            at_local: false,
            copy: None,
        });
    }

    /// Sends a body again under a write grant used before (a retry of a put whose answer
    /// was lost, or anyone replaying its URL).
    pub fn replay(&mut self, cx: &mut Cx, pick: u64) -> bool {
        if self.grants.is_empty() {
            return false;
        }
        let (key, hop) = self.grants[(pick % self.grants.len() as u64) as usize].clone();
        let (op, val) = cx.ledger.begin(key, true, cx.now);
        let req = Req::Write {
            key,
            val,
            grant: hop.grant,
            next: hop.next.map(|b| *b),
        };
        cx.log(format!("replays a write grant of k{key} (value {val})"));
        let call = cx.request(hop.to, req);
        self.op = Some(Op {
            ask: Ask::Get { key },
            kind: Kind::Replay { op },
            call,
            deadline: cx.now + CLIENT_TIMEOUT_MS,
            tries: 0,
            at_local: true,
            copy: None,
        });
        true
    }

    fn end(&mut self, cx: &mut Cx, outcome: Outcome) {
        let Some(op) = self.op.take() else {
            return;
        };
        let counts = &mut *cx.counts;
        match op.kind {
            Kind::Put { op, .. } | Kind::Replay { op } => {
                cx.ledger.finish(op, cx.now, outcome, counts)
            }
            Kind::Delete { ops } => {
                for o in ops {
                    cx.ledger.finish(o, cx.now, outcome, counts);
                }
            }
            Kind::Get { .. } => {}
        }
    }

    pub fn on_reply(&mut self, cx: &mut Cx, call: u64, rep: Rep, pick: u64) {
        let Some(op) = self.op.as_mut().filter(|o| o.call == call) else {
            return;
        };
        match rep {
            Rep::NotLeader(_) | Rep::Unreachable if !op.at_local => {
                self.leader = match rep {
                    Rep::NotLeader(l) => l,
                    _ => None,
                };
                op.tries += 1;
                if op.tries > 3 {
                    // Refused by every meta's gate: a put never took effect.
                    let outcome = match op.kind {
                        Kind::Put { .. } => Outcome::Refused,
                        _ => Outcome::Unknown,
                    };
                    return self.end(cx, outcome);
                }
                let req = Client::request(&op.ask);
                let (tries, _) = (op.tries, ());
                let to = self.meta(pick + tries as u64);
                let call = cx.request(to, req);
                self.op.as_mut().expect("an op").call = call;
            }
            Rep::Redirect(hop) => {
                let (to, req) = match &op.kind {
                    Kind::Put { val, .. } => {
                        let key = match op.ask {
                            Ask::Put { key, .. } => key,
                            _ => unreachable!("a put's ask"),
                        };
                        self.grants.push((key, hop.clone()));
                        if self.grants.len() > 8 {
                            self.grants.remove(0);
                        }
                        let req = Req::Write {
                            key,
                            val: *val,
                            grant: hop.grant,
                            next: hop.next.map(|b| *b),
                        };
                        (hop.to, req)
                    }
                    Kind::Get { .. } => {
                        let key = match op.ask {
                            Ask::Get { key } => key,
                            _ => unreachable!("a get's ask"),
                        };
                        // Half the gets as a same-host client asking for a mapped answer.
                        let req = Req::Read {
                            key,
                            grant: hop.grant,
                            map: self.mapped && pick % 2 == 0,
                        };
                        (hop.to, req)
                    }
                    _ => return self.end(cx, Outcome::Unknown),
                };
                let call = cx.request(to, req);
                let op = self.op.as_mut().expect("an op");
                op.call = call;
                op.at_local = true;
                op.deadline = cx.now + CLIENT_TIMEOUT_MS;
            }
            Rep::Bytes(read) => {
                if let (Kind::Get { invoke }, Ask::Get { key }) = (&op.kind, &op.ask) {
                    let (key, invoke) = (*key, *invoke);
                    cx.ledger.read(key, invoke, cx.now, read, false, cx.counts);
                    if read != Read::Refused {
                        cx.log(format!("read k{key}: {read:?}"));
                    }
                }
                self.op = None;
            }
            Rep::Mapped(m) if matches!(op.kind, Kind::Get { .. }) => {
                // The copy from the mapping takes microseconds, or (a quarter of them) up to
                // 8 s: a client descheduled or frozen mid-copy, past the grant and the lease.
                let r = pick >> 8;
                let took = if pick % 4 == 0 { r % 8000 } else { r % 2 };
                op.copy = Some((m, cx.now + took));
                op.deadline = cx.now + took + CLIENT_TIMEOUT_MS;
            }
            Rep::Done(v) => {
                let outcome = match v {
                    Verdict::Ok => Outcome::Ok,
                    Verdict::Refused => Outcome::Refused,
                    _ => Outcome::Unknown,
                };
                self.end(cx, outcome);
            }
            Rep::Removed(verdicts) => {
                if let Some(Op {
                    kind: Kind::Delete { ops },
                    ..
                }) = self.op.take()
                {
                    for (o, v) in ops.into_iter().zip(verdicts) {
                        let outcome = if v == Verdict::Ok {
                            Outcome::Ok
                        } else {
                            Outcome::Unknown
                        };
                        cx.ledger.finish(o, cx.now, outcome, cx.counts);
                    }
                }
            }
            _ => self.end(cx, Outcome::Unknown),
        }
    }

    /// A mapped read whose copy ends now or before.
    pub fn copy_due(&self, now: u64) -> Option<Mapped> {
        let (m, at) = self.op.as_ref()?.copy?;
        (at <= now).then_some(m)
    }

    /// The end of a mapped read's copy: what it took, or `None` when it counts for nothing
    /// (the get ends without a value, as one whose server went away).
    pub fn copied(&mut self, cx: &mut Cx, got: Option<Read>) {
        let Some(op) = self.op.take() else {
            return;
        };
        if let (Kind::Get { invoke }, Ask::Get { key }) = (&op.kind, &op.ask) {
            match got {
                Some(read) => {
                    cx.counts.mapped_reads += 1;
                    cx.ledger
                        .read(*key, *invoke, cx.now, read, false, cx.counts);
                    cx.log(format!("read k{key} through a mapping: {read:?}"));
                }
                None => cx.counts.mapped_discarded += 1,
            }
        }
    }

    /// Gives up an operation past its deadline; returns what it asked, to retry.
    pub fn tick(&mut self, cx: &mut Cx) -> Option<Ask> {
        let op = self.op.as_ref()?;
        if op.deadline > cx.now {
            return None;
        }
        let ask = match op.kind {
            Kind::Replay { .. } => None,
            _ => Some(op.ask.clone()),
        };
        self.end(cx, Outcome::Unknown);
        self.leader = None;
        ask
    }
}
