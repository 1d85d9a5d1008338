//! A meta's re-replication (`shards/rereplicate.rs` and `http/handlers/copies.rs`): the
//! objects its store queued below their replica count, copied to another rank a few at a
//! time while this meta serves, each fetched from a readable copy under a read grant and
//! written under a write grant carrying the object's stamp and its floor.

use super::super::key_of;
use super::super::net::{Read, Rep, Req, Verdict};
use super::super::timing::*;
use super::super::world::Cx;
use super::*;

/// One copy in flight.
pub(super) struct Copy {
    m: Move,
    /// Its write grant's floor (`copies.rs` `copy_floor`).
    floor: u64,
}

impl Meta {
    /// `Shard::rereplicate_while_waiting`, one turn: while serving, the freed logs' floors
    /// taken, then the store's copies started.
    pub(super) fn rereplicate_step(&mut self, cx: &mut Cx) {
        if !self.serving(cx.now) || !self.store.rereplication_waiting() {
            return;
        }
        let floors = self.logs.floors();
        for m in self.store.begin_rereplicate() {
            let floor = self.copy_floor(cx, &floors, &m.to);
            let key = key_of(&m.key).expect("a workload key");
            cx.log(format!(
                "re-replicating k{key} from rank {} to rank {}",
                m.from.seg.rank, m.to.seg.rank
            ));
            let Some(h) = self.read_grant(cx, key, &m.from) else {
                self.finish_copy(cx, Copy { m, floor }, false);
                continue;
            };
            let call = cx.request(
                h.to,
                Req::Read {
                    key,
                    grant: h.grant,
                    map: false,
                },
            );
            self.calls.insert(
                call,
                (
                    cx.now + HOP_TIMEOUT_MS,
                    Call::Rerepl(Copy { m, floor }, false),
                ),
            );
        }
        self.after_store();
    }

    /// An answer to a re-replication's fetch (`written` false) or write.
    pub(super) fn rerepl_answer(&mut self, cx: &mut Cx, c: Copy, written: bool, rep: Rep) {
        match (written, rep, c.m.to.seg.backend.remote()) {
            (false, Rep::Bytes(Read::Val(v)), Some(_)) => {
                let call = super::drain::copy_write(cx, &c.m, c.floor, v);
                self.calls
                    .insert(call, (cx.now + HOP_TIMEOUT_MS, Call::Rerepl(c, true)));
            }
            (true, Rep::Done(Verdict::Ok), _) => self.finish_copy(cx, c, true),
            _ => self.finish_copy(cx, c, false),
        }
    }

    /// `finish_rereplicate`: the new copy readable, or let go.
    fn finish_copy(&mut self, cx: &mut Cx, c: Copy, ok: bool) {
        let key = key_of(&c.m.key).expect("a workload key");
        cx.log(format!(
            "re-replication of k{key} to rank {}: {}",
            c.m.to.seg.rank,
            if ok { "copied" } else { "failed" }
        ));
        cx.counts.rereplicated += ok as u64;
        self.store.finish_rereplicate(c.m.to.handle, ok);
        self.after_store();
    }
}
