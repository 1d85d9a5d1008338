//! Waits: commands that complete later (an allocation waiting for flushes to make room, a
//! read waiting for a rewarm, an unmount waiting for pins to end).

use std::rc::Rc;
use std::time::Duration;

use super::io_jobs::{DAMAGED_ON_SSD, read_outcome};
use super::store::{self, AllocStep, GetStep, IoJob, IoOutcome, Placement};
use super::{Reply, Shard};
use crate::common::error_kind::{ErrorKind, Refusal};

/// What a read waits for before it looks at the object again (with the event generation
/// seen before the attempt that decided to wait, so no notification is missed).
pub(super) enum Waiting {
    Job(IoJob),
    Rewarm(u64),
    Flush(u64),
}

impl Waiting {
    pub(super) fn new(flush: bool, (rewarms, flushes): (u64, u64)) -> Waiting {
        if flush {
            Waiting::Flush(flushes)
        } else {
            Waiting::Rewarm(rewarms)
        }
    }
}

/// The longest an allocation waits for zombies' leases before it evicts instead (the default
/// `ock.mmc.lease_ms`): a longer lease would hold puts back longer than a client's patience.
const ROOM_WAIT_MAX: Duration = Duration::from_secs(2);

impl Shard {
    /// One attempt at an allocation (`patient`: it may answer [`AllocStep::WaitForRoom`]
    /// rather than evict).
    pub(super) fn try_alloc(
        &self,
        key: &[u8],
        size: u64,
        placement: Placement,
        patient: bool,
    ) -> AllocStep {
        let mut store = self.store.borrow_mut();
        if patient {
            store.alloc(key.into(), size, placement)
        } else {
            store.alloc_now(key.into(), size, placement)
        }
    }

    /// An allocation that found no room while some was coming back: flushes in flight (tried
    /// again as each lands, 64 times at most) or this shard's zombies (tried again when the
    /// first of their leases ends). Zombies are waited for one lease at most (capped at
    /// [`ROOM_WAIT_MAX`], plus a tick): every lease held when it began has ended by then, and
    /// under a churn of leased removals new zombies keep coming, so past that the allocation
    /// evicts what it needs ([`store::Store::alloc_now`]).
    pub(super) async fn alloc_waiting(
        self: Rc<Self>,
        key: Box<[u8]>,
        size: u64,
        placement: Placement,
        first: AllocStep,
        mut flushes: u64,
    ) -> Reply {
        const FLUSH_WAITS: usize = 64;
        let lease = Duration::from_millis(self.shared.config.store.lease_ms);
        let patience = lease.min(ROOM_WAIT_MAX) + Duration::from_millis(crate::limits::TICK_MS);
        let started = std::time::Instant::now();
        let mut flush_waits = 0;
        let mut step = first;
        loop {
            match step {
                AllocStep::WaitForFlush => {
                    if flush_waits == FLUSH_WAITS {
                        return Reply::Refused(Refusal::of(ErrorKind::NoSpace));
                    }
                    flush_waits += 1;
                    self.flush_done.wait_since(flushes).await;
                }
                AllocStep::WaitForRoom { in_ms } => {
                    monoio::time::sleep(Duration::from_millis(in_ms)).await
                }
                step => return self.alloc_reply(step),
            }
            let patient = started.elapsed() < patience;
            // Taken before the attempt, so a flush landing after it is not missed.
            flushes = self.flush_done.generation();
            step = self.try_alloc(&key, size, placement, patient);
            self.after_store();
        }
    }

    /// A read that needs the object rewarmed from SSD: run the rewarm (or wait for another
    /// reader's, or for a flush to make room in DRAM), then read the DRAM copy.
    pub(super) async fn get_after_rewarm(
        self: Rc<Self>,
        key: Box<[u8]>,
        mut next: Option<Waiting>,
    ) -> Reply {
        const ATTEMPTS: usize = 64;
        for _ in 0..ATTEMPTS {
            let marks = self.wait_marks();
            let step = match next.take() {
                Some(Waiting::Job(j)) => match self.run_rewarm(&j).await {
                    Ok(()) => self.store.borrow_mut().get_after_rewarm(&key),
                    Err(refused) => return refused,
                },
                Some(Waiting::Rewarm(g)) => {
                    self.rewarm_done.wait_since(g).await;
                    self.store.borrow_mut().get(&key)
                }
                Some(Waiting::Flush(g)) => {
                    self.flush_done.wait_since(g).await;
                    self.store.borrow_mut().get(&key)
                }
                None => self.store.borrow_mut().get(&key),
            };
            self.after_store();
            match step {
                GetStep::Ready(view) => return self.pinned(view),
                GetStep::NotFound => return Reply::NotFound,
                GetStep::Failed(m) => return Reply::Refused(m),
                GetStep::Rewarm(j) => next = Some(Waiting::Job(j)),
                GetStep::Wait => next = Some(Waiting::Rewarm(marks.0)),
                GetStep::WaitForFlush => next = Some(Waiting::Flush(marks.1)),
                GetStep::ReadDirect(job) => return self.read_direct(job).await,
            }
        }
        // Waited long enough (rewarms and flushes kept not making room): serve from memory
        // or straight from the SSD copy rather than sending the reader away.
        let step = self.store.borrow_mut().get_direct(&key);
        self.after_store();
        match step {
            GetStep::Ready(view) => self.pinned(view),
            GetStep::NotFound => Reply::NotFound,
            GetStep::Failed(m) => Reply::Refused(m),
            GetStep::ReadDirect(job) => self.read_direct(job).await,
            GetStep::Rewarm(_) | GetStep::Wait | GetStep::WaitForFlush => {
                unreachable!("a direct read never waits")
            }
        }
    }

    /// Runs a read's rewarm and hands its outcome to the store; `Err` is the read's answer
    /// when the rewarm failed.
    async fn run_rewarm(self: &Rc<Self>, j: &IoJob) -> Result<(), Reply> {
        let (outcome, _, micros) = self.timed_job_io(j).await;
        let rank = match j {
            IoJob::Rewarm { dst_view, .. } => dst_view.seg.rank,
            IoJob::Flush { .. } | IoJob::Demote { .. } | IoJob::ReadSsd { .. } => 0,
        };
        self.store.borrow_mut().finish_rewarm(j, outcome, micros);
        self.after_store();
        self.rewarm_done.notify_all();
        if outcome == IoOutcome::Done {
            return Ok(());
        }
        self.store_stats().record(
            crate::metrics::store::Op::Get,
            crate::metrics::store::Outcome::Failure,
            Some(rank),
        );
        Err(Reply::refused(
            ErrorKind::Failed,
            match outcome {
                IoOutcome::Damaged => DAMAGED_ON_SSD,
                _ => "I/O error while rewarming the object from SSD",
            },
        ))
    }

    /// The (rewarm, flush) event generations, taken before an attempt that may wait.
    pub(super) fn wait_marks(&self) -> (u64, u64) {
        (self.rewarm_done.generation(), self.flush_done.generation())
    }

    /// Serves a read from the SSD copy (DRAM had no room to rewarm it).
    pub(super) async fn read_direct(self: &Rc<Self>, job: IoJob) -> Reply {
        let IoJob::ReadSsd { src_view, sum, .. } = &job else {
            unreachable!()
        };
        if src_view.seg.backend.remote().is_some() {
            // A remote rank's SSD copy: its local service reads it under a read grant (and
            // checks it against the checksum the grant carries). The direct read's pin and
            // lease go with the reply, as a memory copy's do.
            let view = src_view.clone();
            self.store
                .borrow_mut()
                .count_remote_direct_read(view.seg.rank);
            self.after_store();
            return self.pinned(view);
        }
        let len = src_view.len as usize;
        let buf = store::ssd::IoBuffer::owned(Vec::with_capacity(len), false);
        let (res, buf) = self
            .ssd
            .read(src_view.seg.arc(), src_view.offset, buf)
            .await;
        let outcome = read_outcome(&res, &buf, *sum);
        self.store.borrow_mut().finish_direct_read(&job, outcome);
        self.after_store();
        match outcome {
            IoOutcome::Done => Reply::Value(bytes::Bytes::from(buf.into_vec())),
            IoOutcome::Damaged => Reply::refused(ErrorKind::Failed, DAMAGED_ON_SSD),
            IoOutcome::Failed => Reply::refused(
                ErrorKind::Failed,
                "I/O error while reading the object from SSD",
            ),
        }
    }

    /// Frees the objects of a `remove_all` one slice at a time, letting the requests queued
    /// meanwhile run between slices.
    pub(super) async fn purge_in_slices(self: Rc<Self>) {
        while self.store.borrow_mut().continue_purge() {
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        self.after_store();
        self.purge_running.set(false);
    }

    /// A segment step that found blobs still pinned: retried every 5 ms until the readers
    /// let go, for at most 10 s; then refused with `stuck`.
    pub(super) async fn once_unpinned(
        self: Rc<Self>,
        seg: store::segment::SegmentId,
        step: fn(&mut store::Store, store::segment::SegmentId) -> bool,
        stuck: &'static str,
    ) -> Reply {
        for _ in 0..2000 {
            monoio::time::sleep(Duration::from_millis(5)).await;
            let done = step(&mut self.store.borrow_mut(), seg);
            self.after_store();
            if done {
                return Reply::Done;
            }
        }
        Reply::refused(ErrorKind::Failed, stuck)
    }
}
