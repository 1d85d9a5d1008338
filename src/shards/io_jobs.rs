//! I/O jobs: the store's flushes, rewarms and direct reads, run on the shard's ring or the
//! SSD I/O threads, their completion handed back to the store; probes of faulted SSD files.

use std::rc::Rc;
use std::time::Instant;

use super::Shard;
use super::store::{self, IoJob, IoOutcome};
use crate::metrics::otlp::{Attr, Kind, SpanRecord};
use crate::metrics::trace::Tp;

fn outcome_name(o: IoOutcome) -> &'static str {
    match o {
        IoOutcome::Done => "done",
        IoOutcome::Failed => "failed",
        IoOutcome::Damaged => "damaged",
    }
}

/// The answer to a read whose SSD copy came back damaged (and was dropped).
pub const DAMAGED_ON_SSD: &str =
    "The object's copy on SSD is damaged (checksum mismatch or short read) and was dropped";

/// How a read from SSD ended: a short read or bytes not matching `sum` mean the copy is
/// damaged; another error may pass.
pub(super) fn read_outcome(
    res: &std::io::Result<()>,
    buf: &store::ssd::IoBuffer,
    sum: u64,
) -> IoOutcome {
    match res {
        Ok(()) if store::ssd::checksum(buf.as_slice()) == sum => IoOutcome::Done,
        Ok(()) => IoOutcome::Damaged,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => IoOutcome::Damaged,
        Err(_) => IoOutcome::Failed,
    }
}

impl Shard {
    /// Starts the store's pending I/O jobs and hands its events to their consumers.
    pub(super) fn after_store(self: &Rc<Self>) {
        if !self.store.borrow().has_output() {
            return;
        }
        let jobs = self.store.borrow_mut().take_jobs();
        for job in jobs {
            self.spawn_job(job);
        }
        if self.store.borrow().has_journal_out() {
            self.store.borrow_mut().push_journal();
        }
        if self.store.borrow().has_freed_remote() {
            let freed = self.store.borrow_mut().take_freed_remote();
            self.shared.membership.freed_logs.push(freed);
        }
        // Swap the store's event buffer with ours, so neither allocates per operation.
        let mut events = std::mem::take(&mut *self.event_buf.borrow_mut());
        self.store.borrow_mut().swap_events(&mut events);
        if !events.is_empty() {
            let now = self.shared.clock.now_ms();
            let kv = self.shared.exports.kv_queue.get();
            for ev in events.drain(..) {
                if let Some(kv) = kv {
                    kv.produce(self.id, &ev);
                }
                self.bus.publish(now, ev);
            }
        }
        *self.event_buf.borrow_mut() = events;
    }

    pub(super) fn spawn_job(self: &Rc<Self>, job: IoJob) {
        let me = self.clone();
        monoio::spawn(async move {
            let (outcome, sum, micros) = me.timed_job_io(&job).await;
            match &job {
                IoJob::Flush { .. } => {
                    let ok = outcome == IoOutcome::Done;
                    me.store.borrow_mut().finish_flush(&job, ok, sum, micros);
                    me.flush_done.notify_all();
                }
                IoJob::Rewarm { .. } => {
                    me.store.borrow_mut().finish_rewarm(&job, outcome, micros);
                    me.rewarm_done.notify_all();
                }
                IoJob::Demote { .. } => {
                    let ok = outcome == IoOutcome::Done;
                    me.store.borrow_mut().finish_demote(&job, ok);
                    // Its landing frees HBM room an allocation may be waiting for.
                    me.flush_done.notify_all();
                }
                IoJob::ReadSsd { .. } => me.store.borrow_mut().finish_direct_read(&job, outcome),
            }
            me.after_store();
        });
    }

    /// Runs a job's I/O under its tracepoint; returns how it ended, the checksum of the bytes
    /// a flush wrote, and the time it took.
    pub(super) async fn timed_job_io(&self, job: &IoJob) -> (IoOutcome, u64, u64) {
        let tp = match job {
            IoJob::Flush { .. } => Tp::Flush,
            IoJob::Demote { .. } => Tp::Evict,
            IoJob::Rewarm { .. } | IoJob::ReadSsd { .. } => Tp::Rewarm,
        };
        let span = self.remote().tracer.begin(tp);
        let otlp = self.job_span(job);
        let start = Instant::now();
        let (outcome, sum) = self.run_job_io(job).await;
        let elapsed = start.elapsed();
        span.end(outcome == IoOutcome::Done);
        if let Some(mut s) = otlp {
            s.attr("mmc.outcome", Attr::Static(outcome_name(outcome)));
            s.error = outcome != IoOutcome::Done;
            s.end(elapsed);
            self.shared.exports.telemetry.record(s);
        }
        (outcome, sum, elapsed.as_micros() as u64)
    }

    /// The OTLP span of a job (sampled as a root at the configured ratio): its kind, bytes,
    /// source rank and medium, and this shard.
    fn job_span(&self, job: &IoJob) -> Option<SpanRecord> {
        let t = &self.shared.exports.telemetry;
        if !t.tracing() {
            return None;
        }
        let (ctx, _) = t.start(None)?;
        let (name, view) = match job {
            IoJob::Flush { src_view, .. } => ("mmc.flush", src_view),
            IoJob::Rewarm { src_view, .. } => ("mmc.rewarm", src_view),
            IoJob::Demote { src_view, .. } => ("mmc.demote", src_view),
            IoJob::ReadSsd { src_view, .. } => ("mmc.ssd_read", src_view),
        };
        let mut s = SpanRecord::begin(ctx, None, name, Kind::Internal);
        s.attr("mmc.bytes", Attr::Int(view.len as i64))
            .attr("mmc.rank", Attr::Int(i64::from(view.seg.rank)))
            .attr("mmc.shard", Attr::Int(self.id as i64));
        Some(s)
    }

    /// Publishes the one `Cleared` event of a remove_all (after every shard cleared).
    pub fn publish_cleared(self: &Rc<Self>) {
        self.store
            .borrow_mut()
            .push_event(crate::common::event::Event::Cleared);
        self.after_store();
    }

    /// The I/O of a job: memory → SSD file for a flush (returning the checksum of the bytes
    /// written), SSD file → DRAM for a rewarm (checking the bytes read against theirs), a
    /// remote rank's tier moves by its local service, and a drain's demotion here (HBM →
    /// DRAM) by the mover thread.
    pub(super) async fn run_job_io(&self, job: &IoJob) -> (IoOutcome, u64) {
        if let IoJob::Flush {
            src_view, dst_view, ..
        }
        | IoJob::Rewarm {
            src_view, dst_view, ..
        }
        | IoJob::Demote {
            src_view, dst_view, ..
        } = job
            && src_view.seg.backend.remote().is_some()
        {
            // A remote rank's tier move: its local service copies between its own segments.
            return match &self.shared.front.remote_tier {
                Some(t) => t.copy(&self.shared, src_view, dst_view).await,
                None => (IoOutcome::Failed, 0),
            };
        }
        match job {
            IoJob::Flush {
                src_view, dst_view, ..
            } => self.flush_io(src_view, dst_view).await,
            IoJob::Demote {
                src_view, dst_view, ..
            } => {
                let landed = super::mover::move_down(src_view, dst_view).await;
                let outcome = if landed {
                    IoOutcome::Done
                } else {
                    IoOutcome::Failed
                };
                (outcome, 0)
            }
            IoJob::ReadSsd { .. } => (IoOutcome::Failed, 0),
            IoJob::Rewarm {
                src_view,
                dst_view,
                sum,
                ..
            } => (self.rewarm_io(src_view, dst_view, *sum).await, 0),
        }
    }

    /// Writes a memory blob to its SSD blob; returns the checksum of the bytes written. Also
    /// a local service's half of a remote flush (`POST /cluster/v1/move`).
    pub async fn flush_io(&self, src: &store::BlobView, dst: &store::BlobView) -> (IoOutcome, u64) {
        use store::ssd::{IoBuffer, checksum};
        let len = src.len as usize;
        let buf = if src.seg.backend.host_region().is_some() {
            // SAFETY: the source blob is pinned by the flush (`flushing`) until `finish_flush`.
            unsafe { IoBuffer::segment_view(src.seg.clone(), src.offset, len, true) }
        } else {
            let mut v = vec![0u8; len];
            // SAFETY: as above.
            unsafe { src.seg.backend.read(src.offset, &mut v) }.map(|()| IoBuffer::owned(v, true))
        };
        match buf {
            Ok(buf) => {
                let sum = checksum(buf.as_slice());
                match self.ssd.write(dst.seg.arc(), dst.offset, buf).await.0 {
                    Ok(()) => (IoOutcome::Done, sum),
                    Err(_) => (IoOutcome::Failed, 0),
                }
            }
            Err(e) => {
                log::error!("flush: reading {} failed: {e}", src.seg.name);
                (IoOutcome::Failed, 0)
            }
        }
    }

    /// Reads an SSD blob back into its DRAM blob, checking the bytes against `sum`. Also a
    /// local service's half of a remote rewarm.
    pub async fn rewarm_io(
        &self,
        src: &store::BlobView,
        dst: &store::BlobView,
        sum: u64,
    ) -> IoOutcome {
        let len = src.len as usize;
        // SAFETY: the DRAM blob is ALLOCATED for this rewarm and pinned until `finish_rewarm`;
        // nobody else reads or writes it.
        let buf =
            unsafe { store::ssd::IoBuffer::segment_view(dst.seg.clone(), dst.offset, len, false) };
        match buf {
            Ok(buf) => {
                let (res, buf) = self.ssd.read(src.seg.arc(), src.offset, buf).await;
                read_outcome(&res, &buf, sum)
            }
            Err(e) => {
                log::error!("rewarm: {} is not host memory: {e}", dst.seg.name);
                IoOutcome::Failed
            }
        }
    }

    /// Reads `len` bytes of an SSD segment at `offset` through this shard's I/O path and
    /// checks them against `sum` (a local service serving its SSD blob under a read grant).
    pub async fn read_ssd_checked(
        &self,
        seg: &std::sync::Arc<store::segment::Segment>,
        offset: u64,
        len: u64,
        sum: u64,
    ) -> Result<Vec<u8>, IoOutcome> {
        let buf = store::ssd::IoBuffer::owned(Vec::with_capacity(len as usize), false);
        let (res, buf) = self.ssd.read(seg, offset, buf).await;
        match read_outcome(&res, &buf, sum) {
            IoOutcome::Done => Ok(buf.into_vec()),
            outcome => {
                if outcome == IoOutcome::Damaged
                    && let Some(f) = seg.backend.file()
                {
                    f.record_damaged(self.id, "checksum mismatch or short read");
                }
                Err(outcome)
            }
        }
    }

    /// Probes the faulted SSD files whose probe is due (one shard per file per interval):
    /// a successful probe write lets the file take flushes again.
    pub(super) fn probe_faulted_ssd(&self) {
        let now = self.shared.clock.now_ms();
        for seg in self.shared.segments.snapshot().iter() {
            let Some(file) = seg.backend.file() else {
                continue;
            };
            if !file.probe_due(now) {
                continue;
            }
            let seg = seg.clone();
            monoio::spawn(async move {
                let res = store::ssd::probe(&seg).await;
                if let Some(f) = seg.backend.file() {
                    f.finish_probe(&res);
                }
            });
        }
    }
}
