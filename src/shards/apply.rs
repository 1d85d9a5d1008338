//! Command application: the owner shard applies a [`Command`] to the state it owns, one
//! `apply_*` per command, answering now or with a future for work that waits.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use super::store::segment::{Medium, SegmentId};
use super::store::{self, AllocStep, GetStep, IoJob, Placement};
use super::waits::Waiting;
use super::{Command, PinnedBlob, Reply, Shard, WriteGrant};
use crate::common::error_kind::{ErrorKind, Refusal};

/// A command applied now, or work that completes later (I/O, waiting for a flush).
pub enum Applied {
    Now(Reply),
    Later(Pin<Box<dyn Future<Output = Reply>>>),
}

impl Shard {
    /// Applies a command to this shard's own state: now, or as a future for work that waits.
    /// One `apply_*` per command; each leaves the store's jobs and events to `after_store`.
    pub(super) fn try_apply(self: &Rc<Self>, cmd: Command) -> Applied {
        let applied = match cmd {
            Command::MetadataGet { key } => Applied::Now(self.metadata.borrow().get(&key)),
            Command::MetadataPut { key, value } => self.apply_metadata_put(key, value),
            Command::MetadataDelete { key } => self.apply_metadata_delete(key),
            Command::Alloc {
                key,
                size,
                placement,
            } => {
                let view = self.shared.stamp_view();
                self.store.borrow_mut().set_view(view);
                self.apply_alloc(key, size, placement)
            }
            Command::Commit { obj, ok, .. } => {
                Applied::Now(if self.store.borrow_mut().commit(obj, ok) {
                    Reply::Done
                } else {
                    Reply::NotFound
                })
            }
            Command::Get { key } => self.apply_get(key),
            Command::GetElsewhere { key, rank } => {
                let view = self.store.borrow_mut().get_elsewhere(&key, rank);
                Applied::Now(view.map_or(Reply::NotFound, |v| self.pinned(v)))
            }
            Command::Exist { key } => {
                Applied::Now(Reply::Exists(self.store.borrow_mut().exists(&key)))
            }
            Command::Query { key } => self.apply_query(&key),
            Command::Remove { key } => self.apply_remove(&key),
            Command::RemoveAll => self.apply_remove_all(),
            Command::Forget { seg } => self.apply_forget(seg),
            Command::ListKeys {
                cursor,
                max_bytes,
                prefix,
                limit,
            } => self.apply_list_keys(cursor, max_bytes, &prefix, limit),
            Command::EvictNamed { names, locations } => {
                self.apply_evict_named(&names, locations.as_deref())
            }
            Command::PrefetchNamed { names } => self.apply_prefetch_named(&names),
            // Moves this shard's blobs off a segment being unmounted.
            Command::Evacuate { seg } => self.apply_once_unpinned(
                seg,
                store::Store::evacuate,
                "Blobs on the segment stayed in use; unmount incomplete",
            ),
            // Drops a lost remote rank's segment (a pin lasts one answer; leases do not hold
            // a lost rank's blobs).
            Command::DropSegment { seg } => self.apply_once_unpinned(
                seg,
                store::Store::drop_segment,
                "Blobs on the lost segment stayed pinned",
            ),
            Command::BeginMoves { seg, max, room } => Applied::Now(Reply::Moves(
                self.store.borrow_mut().begin_moves(seg, max as usize, room),
            )),
            Command::FinishMove { dst, ok, .. } => {
                self.store.borrow_mut().finish_move(dst, ok);
                Applied::Now(Reply::Done)
            }
            Command::DropDamaged {
                key,
                rank,
                medium,
                offset,
            } => Applied::Now(
                if self
                    .store
                    .borrow_mut()
                    .drop_damaged_at(&key, rank, medium, offset)
                {
                    Reply::Done
                } else {
                    Reply::NotFound
                },
            ),
            Command::Adopt { entries } => {
                Applied::Now(Reply::Adopted(self.store.borrow_mut().adopt(entries)))
            }
            Command::RankBlobs { rank } => {
                Applied::Now(Reply::Entries(self.store.borrow().rank_blobs(rank)))
            }
            Command::Many(cmds) => self.apply_many(cmds),
            Command::Uncounted(inner) => self.apply_uncounted(*inner),
        };
        self.after_store();
        applied
    }

    pub(super) fn apply_metadata_put(&self, key: Box<[u8]>, value: bytes::Bytes) -> Applied {
        if self.shared.ha.enabled() {
            return self.replicate_metadata(crate::ha::MetaOp::Put(key, value));
        }
        let r = self.metadata.borrow_mut().put(key, value);
        self.update_metadata_gauges();
        Applied::Now(r)
    }

    pub(super) fn apply_metadata_delete(&self, key: Box<[u8]>) -> Applied {
        if self.shared.ha.enabled() {
            return self.replicate_metadata(crate::ha::MetaOp::Delete(key));
        }
        let r = self.metadata.borrow_mut().delete(&key);
        self.update_metadata_gauges();
        Applied::Now(r)
    }

    /// An allocation; one that must wait for flushes or zombies to give room back retries
    /// when they did.
    pub(super) fn apply_alloc(
        self: &Rc<Self>,
        key: Box<[u8]>,
        size: u64,
        placement: Placement,
    ) -> Applied {
        let flushes = self.flush_done.generation();
        let step = self.try_alloc(&key, size, placement, true);
        match step {
            AllocStep::WaitForFlush | AllocStep::WaitForRoom { .. } => {
                let me = self.clone();
                Applied::Later(Box::pin(async move {
                    me.alloc_waiting(key, size, placement, step, flushes).await
                }))
            }
            step => Applied::Now(self.alloc_reply(step)),
        }
    }

    /// A read: pinned at once, or after a rewarm, a flush or a direct read from SSD.
    pub(super) fn apply_get(self: &Rc<Self>, key: Box<[u8]>) -> Applied {
        let marks = self.wait_marks();
        let step = self.store.borrow_mut().get(&key);
        let me = self.clone();
        match step {
            GetStep::Ready(view) => Applied::Now(self.pinned(view)),
            GetStep::NotFound => Applied::Now(Reply::NotFound),
            GetStep::Failed(m) => Applied::Now(Reply::Refused(m)),
            GetStep::Rewarm(job) => Applied::Later(Box::pin(async move {
                me.get_after_rewarm(key, Some(Waiting::Job(job))).await
            })),
            GetStep::ReadDirect(job) => {
                Applied::Later(Box::pin(async move { me.read_direct(job).await }))
            }
            GetStep::Wait | GetStep::WaitForFlush => {
                let flush = matches!(step, GetStep::WaitForFlush);
                Applied::Later(Box::pin(async move {
                    me.get_after_rewarm(key, Some(Waiting::new(flush, marks)))
                        .await
                }))
            }
        }
    }

    pub(super) fn apply_query(&self, key: &[u8]) -> Applied {
        Applied::Now(match self.store.borrow_mut().query(key) {
            Some(q) => Reply::Query(Box::new(q)),
            None => Reply::NotFound,
        })
    }

    pub(super) fn apply_remove(&self, key: &[u8]) -> Applied {
        Applied::Now(if self.store.borrow_mut().remove(key) {
            Reply::Done
        } else {
            Reply::NotFound
        })
    }

    /// Drops every key at once; their objects are freed in slices by a task (and by ticks and
    /// allocations), so no request waits behind the whole purge.
    pub(super) fn apply_remove_all(self: &Rc<Self>) -> Applied {
        let n = self.store.borrow_mut().remove_all();
        if self.store.borrow().purging() && !self.purge_running.replace(true) {
            let me = self.clone();
            monoio::spawn(async move { me.purge_in_slices().await });
        }
        Applied::Now(Reply::Count(n))
    }

    /// An unmounted segment is out of the table: let go of this shard's references to it
    /// (its mapping and SSD file close with the last one).
    pub(super) fn apply_forget(&self, seg: SegmentId) -> Applied {
        self.store.borrow_mut().forget_segment(seg);
        self.ssd.forget(seg);
        Applied::Now(Reply::Done)
    }

    /// One page of this shard's keys (`/get_all_keys`), at most `max_bytes` of text.
    pub(super) fn apply_list_keys(
        &self,
        cursor: u32,
        max_bytes: u32,
        prefix: &[u8],
        limit: u64,
    ) -> Applied {
        let mut limit = limit;
        let mut text = Vec::with_capacity(max_bytes as usize + 256);
        let next = self.store.borrow().list_keys(
            cursor,
            max_bytes as usize,
            prefix,
            &mut limit,
            &mut text,
        );
        Applied::Now(Reply::Keys {
            text,
            next,
            limit_left: limit,
        })
    }

    pub(super) fn apply_evict_named(
        &self,
        names: &[Box<[u8]>],
        locations: Option<&[Medium]>,
    ) -> Applied {
        let mut store = self.store.borrow_mut();
        let n = names
            .iter()
            .map(|name| store.evict_named(name, locations))
            .sum();
        Applied::Now(Reply::Count(n))
    }

    /// Starts rewarms of the named objects; answers how many were started.
    pub(super) fn apply_prefetch_named(self: &Rc<Self>, names: &[Box<[u8]>]) -> Applied {
        let jobs: Vec<IoJob> = names
            .iter()
            .flat_map(|name| self.store.borrow_mut().prefetch_named(name))
            .collect();
        let n = jobs.len() as u64;
        for job in jobs {
            self.spawn_job(job);
        }
        Applied::Now(Reply::Count(n))
    }

    /// A store step on segment `seg` that is done once no blob there is pinned (`step`
    /// answers whether it is): done now, or retried as pins end (see
    /// [`Shard::once_unpinned`]).
    pub(super) fn apply_once_unpinned(
        self: &Rc<Self>,
        seg: SegmentId,
        step: fn(&mut store::Store, SegmentId) -> bool,
        stuck: &'static str,
    ) -> Applied {
        if step(&mut self.store.borrow_mut(), seg) {
            Applied::Now(Reply::Done)
        } else {
            let me = self.clone();
            Applied::Later(Box::pin(
                async move { me.once_unpinned(seg, step, stuck).await },
            ))
        }
    }

    /// A read answered without counting it (HEAD): the store's statistics are muted around it.
    pub(super) fn apply_uncounted(self: &Rc<Self>, inner: Command) -> Applied {
        debug_assert!(
            matches!(inner, Command::Query { .. } | Command::Exist { .. }),
            "only reads that answer at once run uncounted"
        );
        // The store records on this thread, synchronously, while the flag is set.
        let stats = self.store_stats();
        stats.set_muted(true);
        let applied = self.try_apply(inner);
        stats.set_muted(false);
        applied
    }

    pub(super) fn update_metadata_gauges(&self) {
        let md = self.metadata.borrow();
        self.stats().metadata_keys.set(md.len() as i64);
        self.stats().metadata_bytes.set(md.bytes_used() as i64);
    }

    pub(super) fn apply_many(self: &Rc<Self>, cmds: Vec<Command>) -> Applied {
        let mut done: Vec<Applied> = Vec::with_capacity(cmds.len());
        for c in cmds {
            done.push(self.try_apply(c));
        }
        if done.iter().all(|a| matches!(a, Applied::Now(_))) {
            return Applied::Now(Reply::Many(
                done.into_iter()
                    .map(|a| match a {
                        Applied::Now(r) => r,
                        Applied::Later(_) => unreachable!(),
                    })
                    .collect(),
            ));
        }
        Applied::Later(Box::pin(async move {
            let mut out = Vec::with_capacity(done.len());
            for a in done {
                out.push(match a {
                    Applied::Now(r) => r,
                    Applied::Later(f) => f.await,
                });
            }
            Reply::Many(out)
        }))
    }

    pub(super) fn pinned(self: &Rc<Self>, view: store::BlobView) -> Reply {
        Reply::Read(PinnedBlob {
            view,
            owner: self.id,
            shared: self.shared.clone(),
            granted: None,
        })
    }

    pub(super) fn alloc_reply(self: &Rc<Self>, step: AllocStep) -> Reply {
        match step {
            AllocStep::Granted { obj, blobs, link } => Reply::Granted(Box::new(WriteGrant::new(
                obj,
                blobs,
                link,
                self.id,
                self.shared.clone(),
            ))),
            AllocStep::Refused(m) => Reply::Refused(m),
            AllocStep::WaitForFlush | AllocStep::WaitForRoom { .. } => {
                Reply::Refused(Refusal::of(ErrorKind::NoSpace))
            }
        }
    }
}
