//! With HA on, the `/metadata` entries of a shard are a copy of etcd's: a write goes to etcd
//! first (the writer thread, `ha/writer.rs`) and is applied here when etcd has it, in etcd's
//! order; a node that becomes leader replaces its copy with etcd's. This is the shard's side:
//! queuing a write, and the applier task that takes the HA threads' messages.

use std::rc::Rc;

use bytes::Bytes;

use super::apply::Applied;
use super::metadata::MetadataStore;
use super::{Reply, Shard, Shared, shard_for};
use crate::common::error_kind::{ErrorKind, Refusal};
use crate::config::Config;
use crate::ha::{HaHost, HaView, MetaOp, MetaReply, ShardMsg, WriteReq};

impl HaHost for Shared {
    fn ha(&self) -> &HaView {
        &self.ha
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn shutting_down(&self) -> bool {
        self.is_shutting_down()
    }

    fn owner_shard(&self, key: &[u8]) -> usize {
        shard_for(key, self.shard_count())
    }

    fn failover_span(&self, elapsed: std::time::Duration, ok: bool, view: u64) {
        use crate::metrics::otlp::{Attr, Kind, SpanRecord};
        let t = &self.exports.telemetry;
        let Some((ctx, _)) = t.start_always(None) else {
            return;
        };
        let mut s = SpanRecord::begin(ctx, None, "mmc.failover", Kind::Internal);
        s.start_ns = s.start_ns.saturating_sub(elapsed.as_nanos() as u64);
        s.attr("mmc.ha.view_version", Attr::Int(view as i64))
            .attr("mmc.ha.serving", Attr::Bool(ok));
        s.error = !ok;
        s.end(elapsed);
        t.record(s);
    }
}

impl From<MetaReply> for Reply {
    fn from(r: MetaReply) -> Reply {
        match r {
            MetaReply::Done => Reply::Done,
            MetaReply::NotFound => Reply::NotFound,
            MetaReply::Refused(msg) => Reply::Refused(Refusal::new(ErrorKind::Failed, msg)),
        }
    }
}

impl Shard {
    /// Queues a `/metadata` write for etcd (HA on); the answer comes when it was stored (or
    /// refused) and applied here.
    pub(super) fn replicate_metadata(&self, op: MetaOp) -> Applied {
        let reserved = match &op {
            MetaOp::Put(k, v) => MetadataStore::put_cost(k, v.len()),
            MetaOp::Delete(_) => 0,
        };
        if !self.metadata.borrow_mut().reserve(reserved) {
            return Applied::Now(Reply::refused(ErrorKind::NoSpace, "Metadata store full"));
        }
        let (done, answer) = flume::bounded(1);
        let req = WriteReq {
            shard: self.id,
            fence: self.shared.ha.fence(),
            op,
            reserved,
            done,
        };
        if self.shared.ha.submit_write(req).is_err() {
            self.metadata.borrow_mut().unreserve(reserved);
            return Applied::Now(Reply::Overloaded);
        }
        Applied::Later(Box::pin(async move {
            answer.recv_async().await.map_or_else(
                |_| Reply::refused(ErrorKind::Failed, "The /metadata write was abandoned"),
                Reply::from,
            )
        }))
    }

    /// Queues a KV-event `BlockStored` for every block this shard's store holds (a new
    /// leadership's re-announcement, right after its epoch's `AllBlocksCleared`). Straight to
    /// the KV queue: these are no new writes, so the event bus and its metrics do not see them.
    /// Paced: past half the queue's soft capacity it waits for the publisher to drain, so a
    /// large store is re-announced whole instead of overflowing the queue (stored events are
    /// the first dropped).
    async fn announce_held_blocks(&self) {
        let Some(kv) = self.shared.exports.kv_queue.get().cloned() else {
            return;
        };
        let held = self.store.borrow().held_blocks();
        for (chunk, medium, size) in held {
            while !kv.has_room_for_burst() && !self.shared.is_shutting_down() {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            kv.produce(
                self.id,
                &crate::common::event::Event::Stored {
                    chunk: Some(chunk),
                    medium,
                    size,
                },
            );
        }
    }

    /// The applier: applies what the HA threads send this shard, in order. Runs for the
    /// shard's life (HA on only).
    pub async fn ha_applier(self: Rc<Self>) {
        let Some(inbox) = self.shared.ha.shard_inbox(self.id) else {
            return;
        };
        while let Ok(msg) = inbox.recv_async().await {
            match msg {
                ShardMsg::Written {
                    op,
                    reserved,
                    outcome,
                    done,
                } => {
                    self.metadata.borrow_mut().unreserve(reserved);
                    let reply = match outcome {
                        Err(msg) => MetaReply::Refused(msg.into()),
                        Ok(existed) => {
                            let mut md = self.metadata.borrow_mut();
                            match op {
                                MetaOp::Put(k, v) => match md.put(k, v) {
                                    Reply::Done => MetaReply::Done,
                                    Reply::Refused(why) => MetaReply::Refused(why.message),
                                    other => unreachable!("a /metadata put answers {other:?}"),
                                },
                                MetaOp::Delete(k) => {
                                    md.delete(&k);
                                    if existed {
                                        MetaReply::Done
                                    } else {
                                        MetaReply::NotFound
                                    }
                                }
                            }
                        }
                    };
                    self.update_metadata_gauges();
                    let _ = done.send(reply);
                }
                ShardMsg::Reset { ack } => {
                    self.metadata.borrow_mut().clear();
                    self.update_metadata_gauges();
                    let _ = ack.send(());
                }
                ShardMsg::Purge { ack } => {
                    let _ = self.try_apply(super::Command::RemoveAll);
                    // Another leader served since: catalogs handed over now come from its
                    // lineage, which this node's removals do not concern.
                    self.store.borrow_mut().reset_tombstones();
                    let _ = ack.send(());
                }
                ShardMsg::Announce { ack } => {
                    self.announce_held_blocks().await;
                    let _ = ack.send(());
                }
                ShardMsg::Load { entries, ack } => {
                    let mut refused = 0;
                    {
                        let mut md = self.metadata.borrow_mut();
                        for (k, v) in entries {
                            if !matches!(md.put(k, Bytes::clone(&v)), Reply::Done) {
                                refused += 1;
                            }
                        }
                    }
                    if refused > 0 {
                        log::warn!(
                            "shard {}: {refused} /metadata entries from etcd do not fit ock.mmc.metadata.max_total_bytes",
                            self.id
                        );
                    }
                    self.update_metadata_gauges();
                    let _ = ack.send(());
                }
            }
        }
    }
}
