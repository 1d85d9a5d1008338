//! A meta's data plane in the simulation (`meta.rs`): puts, gets and removals with their
//! barriers and pushes, mirroring the object handlers and `http/handlers/freed.rs`.

use super::super::net::{Hop, PushNews, Read, Rep, Req, Verdict};
use super::super::timing::*;
use super::super::world::Cx;
use super::super::{Key, Node, key_bytes};
use super::*;
use crate::cluster::catalog::key_hash;
use crate::cluster::records::{Removal, Settled};
use crate::grant::{Grant, GrantOp};
use crate::shards::store::segment::{Medium, PAGE_BYTES};
use crate::shards::store::{AllocStep, BlobView, GetStep, Placement};

impl Meta {
    /// `objects.rs` `put` and `remote.rs` `redirect_write`: the chain's grants.
    pub(super) fn put(
        &mut self,
        cx: &mut Cx,
        from: Node,
        call: u64,
        key: Key,
        pages: u64,
        replicas: u8,
    ) {
        if !self.gate(cx, from, call) {
            return;
        }
        let hash = key_hash(&key_bytes(key));
        if self.logs.unconfirmed(hash) && !cx.mutations.put_over_unconfirmed {
            let removal = Removal::new(&self.logs, &[hash], cx.now, HB_TIMEOUT_MS);
            cx.log(format!(
                "put k{key} waits for an older copy's removal to be confirmed"
            ));
            self.waiting.push(Waiting {
                to: from,
                call,
                removal,
                results: Vec::new(),
                put: Some((key, pages, replicas)),
            });
            self.poll_removals(cx);
            return;
        }
        let view = self.stamp_view();
        self.store.set_view(view);
        let before = self.stamps();
        let size = pages * PAGE_BYTES - 64;
        let mut step = self.store.alloc(
            key_bytes(key),
            size,
            Placement::on(Some(Medium::Dram), replicas),
        );
        if let AllocStep::WaitForRoom { .. } = step {
            // The handler waits for leased room, then evicts; the wait is not modelled.
            step = self.store.alloc_now(
                key_bytes(key),
                size,
                Placement::on(Some(Medium::Dram), replicas),
            );
        }
        self.after_store();
        self.excuse_gone(cx, &before, "evicted");
        let (obj, blobs) = match step {
            AllocStep::Granted { obj, blobs, .. } => (obj, blobs),
            AllocStep::Refused(why) => {
                cx.log(format!("put k{key} refused: {why}"));
                cx.reply(from, call, Rep::Done(Verdict::Refused));
                return;
            }
            AllocStep::WaitForFlush | AllocStep::WaitForRoom { .. } => {
                cx.reply(from, call, Rep::Done(Verdict::Failed));
                return;
            }
        };
        let ranks: Vec<u32> = blobs.iter().map(|b| b.seg.rank).collect();
        cx.log(format!(
            "put k{key}: {size} bytes on ranks {ranks:?} ({}.{})",
            super::super::short_view(view),
            obj.generation
        ));
        let expires = cx.wall + GRANT_TTL_MS;
        let mut next: Option<Hop> = None;
        for (i, b) in blobs.iter().enumerate().rev() {
            let remote = b.seg.backend.remote().expect("only remote ranks here");
            let g = Grant {
                op: if i == 0 {
                    GrantOp::WriteCommit
                } else {
                    GrantOp::Write
                },
                rank: b.seg.rank,
                medium: b.seg.medium as u8,
                offset: b.offset,
                len: b.len,
                size: b.len,
                obj_id: obj.id,
                obj_generation: obj.generation,
                view,
                expires_ms: expires,
                sum: 0,
                floor: 0,
            };
            let n = next.as_ref().map_or(String::new(), |h| h.url(key));
            let grant = g.sign(&remote.grant_key, &key_bytes(key), n.as_bytes());
            next = Some(Hop {
                to: Node::from_url(&remote.url).expect("a simulated local service"),
                grant,
                next: next.map(Box::new),
            });
        }
        cx.reply(from, call, Rep::Redirect(next.expect("a grant has blobs")));
    }

    /// A read grant on `v` (`remote.rs` `read_grant_url`).
    pub(super) fn read_grant(&self, cx: &Cx, key: Key, v: &BlobView) -> Option<Hop> {
        let remote = v.seg.backend.remote()?;
        let g = Grant {
            op: GrantOp::Read,
            rank: v.seg.rank,
            medium: v.seg.medium as u8,
            offset: v.offset,
            len: v.len,
            size: v.len,
            obj_id: 0,
            obj_generation: 0,
            view: 0,
            expires_ms: cx.wall + GRANT_TTL_MS.min(LEASE_MS),
            sum: v.sum,
            floor: 0,
        };
        Some(Hop {
            to: Node::from_url(&remote.url)?,
            grant: g.sign(&remote.grant_key, &key_bytes(key), b""),
            next: None,
        })
    }

    /// `objects.rs` GET and `remote.rs` `redirect_read`.
    pub(super) fn get(&mut self, cx: &mut Cx, from: Node, call: u64, key: Key) {
        if !self.gate(cx, from, call) {
            return;
        }
        let rep = match self.store.get(&key_bytes(key)) {
            GetStep::Ready(v) => {
                cx.log(format!(
                    "get k{key}: rank {} offset {}",
                    v.seg.rank, v.offset
                ));
                let hop = self.read_grant(cx, key, &v);
                self.store.unpin(v.handle);
                hop.map_or(Rep::Done(Verdict::Failed), Rep::Redirect)
            }
            GetStep::NotFound => Rep::Bytes(Read::NotFound),
            _ => Rep::Done(Verdict::Failed),
        };
        cx.reply(from, call, rep);
    }

    /// `objects.rs` DELETE and `batch_remove`, with `freed.rs` `settle`.
    pub(super) fn delete(&mut self, cx: &mut Cx, from: Node, call: u64, keys: Vec<Key>) {
        if !self.gate(cx, from, call) {
            return;
        }
        let mut hashes = Vec::new();
        let mut results = Vec::new();
        for &k in &keys {
            let found = self.store.remove(&key_bytes(k));
            self.after_store();
            if found {
                cx.ledger.removed(k, cx.now);
            }
            if found && self.logs.has_members() {
                hashes.push(key_hash(&key_bytes(k)));
            }
            results.push(if found {
                Verdict::Ok
            } else {
                Verdict::NotFound
            });
        }
        cx.log(format!("remove {keys:?}: {results:?}"));
        let removal = Removal::new(&self.logs, &hashes, cx.now, HB_TIMEOUT_MS);
        if cx.mutations.no_removal_barrier && !removal.is_settled() {
            cx.log(format!(
                "MUTATION no_removal_barrier: the removal of {keys:?} is answered before its local services dropped the copies"
            ));
        }
        if cx.mutations.no_removal_barrier || removal.is_settled() {
            cx.reply(from, call, Rep::Removed(results));
            return;
        }
        self.waiting.push(Waiting {
            to: from,
            call,
            removal,
            results,
            put: None,
        });
        self.poll_removals(cx);
    }

    /// `freed.rs` `settle`'s loop, one look.
    pub(super) fn poll_removals(&mut self, cx: &mut Cx) {
        let mut i = 0;
        while i < self.waiting.len() {
            match self.waiting[i].removal.poll(&self.logs, cx.now) {
                Settled::Confirmed => {
                    let w = self.waiting.swap_remove(i);
                    match w.put {
                        Some((key, pages, replicas)) => {
                            self.put(cx, w.to, w.call, key, pages, replicas)
                        }
                        None => cx.reply(w.to, w.call, Rep::Removed(w.results)),
                    }
                }
                Settled::Unconfirmed(ranks) => {
                    let w = self.waiting.swap_remove(i);
                    if let Some((key, ..)) = w.put {
                        cx.log(format!(
                            "put k{key} refused: an older copy on ranks {ranks:?} did not confirm its removal"
                        ));
                        cx.reply(w.to, w.call, Rep::Done(Verdict::Refused));
                        continue;
                    }
                    cx.log(format!(
                        "a removal was not confirmed by the local services of ranks {ranks:?}"
                    ));
                    let failed = vec![Verdict::Failed; w.results.len()];
                    cx.reply(w.to, w.call, Rep::Removed(failed));
                }
                Settled::Waiting(ranks) => {
                    for r in ranks {
                        self.push(cx, r);
                    }
                    i += 1;
                }
            }
        }
    }

    /// `freed.rs` `push`.
    pub(super) fn push(&mut self, cx: &mut Cx, rank: u32) {
        let Some(p) = self.logs.take_push(rank) else {
            return;
        };
        let target = self.member_segments(rank, p.epoch).first().and_then(|s| {
            s.backend
                .remote()
                .map(|r| (r.url.clone(), r.grant_key.clone()))
        });
        let Some((url, key)) = target else {
            self.logs.pushed(rank, p.epoch, None);
            return;
        };
        let news = PushNews {
            seq: p.seq,
            freed: p.freed,
        };
        let mac = key.body_mac(&news.body(p.epoch));
        let to = Node::from_url(&url).expect("a simulated local service");
        let call = cx.request(
            to,
            Req::Push {
                epoch: p.epoch,
                news,
                mac,
            },
        );
        let call_entry = Call::Push {
            rank,
            epoch: p.epoch,
        };
        self.calls
            .insert(call, (cx.now + PUSH_TIMEOUT_MS, call_entry));
    }
}
