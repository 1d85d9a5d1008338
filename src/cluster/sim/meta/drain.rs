//! A meta's drops of ended memberships and drains of leaving ones (`meta.rs`), mirroring
//! `Shard::drop_member_segments` and the drain's moves.

use super::super::net::{Read, Rep, Req, Verdict};
use super::super::timing::*;
use super::super::world::Cx;
use super::super::{Node, Vid, key_bytes};
use super::*;
use crate::cluster::catalog::Floors;
use crate::cluster::drain::{Answer, MOVES_PER_ASK, Step};
use crate::grant::{Grant, GrantOp};
use crate::shards::store::BlobView;

impl Meta {
    /// `Shard::drop_member_segments`: the log goes, then every blob on the segments.
    pub(super) fn run_drops(&mut self, cx: &mut Cx) {
        let mut i = 0;
        while i < self.drops.len() {
            let d = &self.drops[i];
            if !d.keep_log {
                if d.retired {
                    self.logs.retire(d.rank, d.epoch);
                } else {
                    // A loss recorded (or none to record), a leave.
                    self.logs.settle(d.rank, d.epoch);
                }
            }
            let before = self.stamps();
            let mut done = true;
            for seg in &d.segs {
                done &= self.store.drop_segment(seg.id);
            }
            self.after_store();
            let d = &self.drops[i];
            let why = if d.retired {
                "its membership was replaced"
            } else {
                "its rank was dropped"
            };
            if d.documented {
                self.excuse_gone(cx, &before, why);
            } else {
                let mut any = false;
                for (k, (b, a)) in before.iter().zip(self.stamps()).enumerate() {
                    if b.is_some() && *b != a {
                        cx.log(format!("k{k} dropped ({why}; its catalog follows)"));
                        any = true;
                    }
                }
                // Until the catalog is adopted (the first heartbeat), those objects read as
                // not found, as after a leader change; the reads once the cluster settled
                // must find them.
                if any {
                    cx.ledger.disrupt(cx.now);
                }
            }
            if !done {
                i += 1;
                continue;
            }
            let d = self.drops.swap_remove(i);
            for seg in &d.segs {
                self.table.remove_id(&seg.name, seg.id);
                self.store.forget_segment(seg.id);
            }
            cx.log(format!("dropped rank {}'s epoch {}", d.rank, d.epoch));
        }
    }

    /// One step of the first drain: its next move, or its end.
    pub(super) fn drain_step(&mut self, cx: &mut Cx) {
        let Some(d) = self.drains.first() else {
            return;
        };
        if d.copying.is_some() {
            return;
        }
        // `cluster.rs` `drain_segments`: ask for moves (making room first when the machine
        // says so) until the machine says the drain is over.
        while self.drains[0].moves.is_empty() {
            match self.drains[0].machine.next(cx.now) {
                Step::Done { moved } => {
                    self.finish_drain(cx, moved);
                    return;
                }
                Step::Wait { .. } => return,
                Step::Ask { seg, room } => {
                    self.drains[0].floors = self.logs.floors();
                    let step = self.store.begin_moves(seg, MOVES_PER_ASK, room);
                    let answer = Answer {
                        moves: step.moves.len(),
                        coming: step.coming,
                        possible: step.room_possible,
                        need: step.need,
                    };
                    self.drains[0].machine.answered(answer, cx.now);
                    self.drains[0].moves.extend(step.moves);
                }
            }
        }
        let Some(m) = self.drains[0].moves.pop() else {
            return;
        };
        let key = super::super::key_of(&m.key).expect("a workload key");
        let hop = self.read_grant(cx, key, &m.from);
        self.drains[0].floor = self.copy_floor(cx, &self.drains[0].floors, &m.to);
        self.drains[0].copying = Some(m);
        match hop {
            Some(h) => {
                let call = cx.request(
                    h.to,
                    Req::Read {
                        key,
                        grant: h.grant,
                        map: false,
                    },
                );
                self.calls
                    .insert(call, (cx.now + HOP_TIMEOUT_MS, Call::Fetch));
            }
            None => self.copy_step(cx, None),
        }
    }

    /// The drain moved what it could: the segments are dropped, the rank forgotten, the
    /// leave answered.
    pub(super) fn finish_drain(&mut self, cx: &mut Cx, moved: u64) {
        let d = self.drains.remove(0);
        self.unmount_member(d.rank, d.epoch);
        self.drops.push(Dropping {
            rank: d.rank,
            epoch: d.epoch,
            segs: d.segs,
            documented: true,
            retired: false,
            keep_log: false,
        });
        self.run_drops(cx);
        self.members.left(d.rank, d.epoch);
        cx.log(format!(
            "rank {} left; {} objects moved to other ranks",
            d.rank, moved
        ));
        cx.reply(d.to, d.call, Rep::Left(true));
    }

    /// A drain's copy (`copies.rs` `copy`): fetched from the leaving rank, written under a
    /// write grant carrying the object's stamp, then `FinishMove`.
    pub(super) fn copy_step(&mut self, cx: &mut Cx, rep: Option<Rep>) {
        let Some(m) = self.drains.first_mut().and_then(|d| d.copying.take()) else {
            return;
        };
        let written = match (rep, m.to.seg.backend.remote()) {
            (Some(Rep::Bytes(Read::Val(v))), Some(_)) => {
                let floor = if cx.mutations.no_copy_floor {
                    0
                } else {
                    self.drains[0].floor
                };
                let call = copy_write(cx, &m, floor, v);
                self.calls
                    .insert(call, (cx.now + HOP_TIMEOUT_MS, Call::Copy));
                self.drains[0].copying = Some(m);
                return;
            }
            (Some(Rep::Done(Verdict::Ok)), _) => true,
            _ => false,
        };
        cx.counts.moves += written as u64;
        self.drains[0].machine.copied(written);
        self.store.finish_move(m.to.handle, written);
    }
}

impl Meta {
    /// `copies.rs` `copy_floor`: the floor of a copy's write grant into `to`, from the logs'
    /// sequences `floors` taken before `to` was allocated (with `late_copy_floor`, the logs'
    /// sequences now, when the copy begins, as it was taken before).
    pub(super) fn copy_floor(&self, cx: &Cx, floors: &Floors, to: &BlobView) -> u64 {
        let Some(r) = to.seg.backend.remote() else {
            return 0;
        };
        if cx.mutations.late_copy_floor {
            self.logs.floors().of(to.seg.rank, r.epoch)
        } else {
            floors.of(to.seg.rank, r.epoch)
        }
    }
}

/// `copies.rs` `write` to a local service: the fetched value `val` written into the copy's
/// new blob under a write grant (`remote.rs` `write_grant_url`) carrying the object's stamp and
/// `floor`. Returns the call.
pub(super) fn copy_write(cx: &mut Cx, m: &Move, floor: u64, val: Vid) -> u64 {
    let key = super::super::key_of(&m.key).expect("a workload key");
    let remote =
        m.to.seg
            .backend
            .remote()
            .expect("a copy into a local service");
    let g = Grant {
        op: GrantOp::Write,
        rank: m.to.seg.rank,
        medium: m.to.seg.medium as u8,
        offset: m.to.offset,
        len: m.to.len,
        size: m.to.len,
        obj_id: 0,
        obj_generation: m.stamp.seq,
        view: m.stamp.view,
        expires_ms: cx.wall + GRANT_TTL_MS,
        sum: 0,
        floor,
    };
    let to = Node::from_url(&remote.url).expect("a simulated local service");
    let grant = g.sign(&remote.grant_key, &key_bytes(key), b"");
    cx.request(
        to,
        Req::Write {
            key,
            val,
            grant,
            next: None,
        },
    )
}
