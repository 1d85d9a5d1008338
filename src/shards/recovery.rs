//! A shard's part of the SSD tier across restarts: at its start, before it accepts, it indexes
//! its share of the blobs each journaled SSD file recovered (`store/recover.rs`), then reads
//! them back one at a time in the background, checking each against its checksum (a damaged
//! one is dropped and counted; every read of an SSD copy is checked anyway, so none is ever
//! served meanwhile). The records the store journals are handed to the journals' thread by
//! `after_store`.

use std::rc::Rc;
use std::time::Instant;

use super::Shard;
use super::store::IoOutcome;
use super::store::ssd::IoBuffer;

/// A blob is read back in pieces of at most this many bytes (one buffer at a time, whatever
/// the object's size).
const VERIFY_CHUNK_BYTES: u64 = 1 << 20;

impl Shard {
    /// Indexes this shard's share of every journaled SSD file's recovered blobs, before the
    /// shard accepts, announces them as KV `BlockStored` (after the stream's opening
    /// `AllBlocksCleared`), and starts reading them back.
    pub(crate) async fn recover_ssd(self: &Rc<Self>) {
        for seg in self.shared.segments.snapshot().iter() {
            let Some(f) = seg.backend.file() else {
                continue;
            };
            let entries = f.take_recovered(self.id);
            if entries.is_empty() {
                continue;
            }
            let started = Instant::now();
            let done = self.store.borrow_mut().recover(seg.id, entries);
            self.announce_recovered().await;
            let micros = started.elapsed().as_micros() as u64;
            f.record_index_time(self.id, micros);
            log::info!(
                "shard {}: {} recovered blobs of {} ({} bytes) indexed in {:.1} ms{}",
                self.id,
                done.blobs,
                seg.name,
                done.bytes,
                micros as f64 / 1e3,
                if done.refused > 0 {
                    format!(
                        "; {} refused (their range taken or their key listed twice)",
                        done.refused
                    )
                } else {
                    String::new()
                }
            );
        }
        if self.store.borrow().verify_pending() {
            monoio::spawn(self.clone().verify_recovered());
        }
    }

    /// The `Stored` events of the blobs just recovered, as KV `BlockStored`: straight to the
    /// KV queue (they are no new writes: the event bus does not see them), paced as a new
    /// leader's re-announcement is (past half the queue's soft capacity it waits for the
    /// publisher), so a large recovery is announced whole. The shard accepts nothing yet, so
    /// no later event of these objects can overtake them.
    async fn announce_recovered(&self) {
        let mut events = Vec::new();
        self.store.borrow_mut().swap_events(&mut events);
        let Some(kv) = self.shared.exports.kv_queue.get().cloned() else {
            return;
        };
        for ev in events {
            while !kv.has_room_for_burst() && !self.shared.is_shutting_down() {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            kv.produce(self.id, &ev);
        }
    }

    /// Reads every recovered blob back once (one at a time: the shard keeps serving, and the
    /// disk's bandwidth goes to requests first).
    async fn verify_recovered(self: Rc<Self>) {
        let started = Instant::now();
        let (mut ok, mut damaged, mut failed) = (0u64, 0u64, 0u64);
        loop {
            if self.shared.is_shutting_down() {
                return;
            }
            let next = self.store.borrow_mut().next_verify();
            let Some(v) = next else {
                break;
            };
            let outcome = self.read_checked(&v.view, v.sum).await;
            match outcome {
                IoOutcome::Done => ok += 1,
                IoOutcome::Damaged => damaged += 1,
                IoOutcome::Failed => failed += 1,
            }
            self.store.borrow_mut().finish_verify(v.handle, outcome);
            self.after_store();
        }
        log::info!(
            "shard {}: {} recovered SSD blobs read back in {:.1} s: {ok} intact, {damaged} damaged (dropped), {failed} unreadable (kept: every read of them is checked)",
            self.id,
            ok + damaged + failed,
            started.elapsed().as_secs_f64()
        );
    }

    /// Reads an SSD blob's `view.len` bytes in pieces and checks them against `sum`.
    async fn read_checked(&self, view: &super::store::BlobView, sum: u64) -> IoOutcome {
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        let mut done = 0u64;
        while done < view.len {
            let n = (view.len - done).min(VERIFY_CHUNK_BYTES) as usize;
            let buf = IoBuffer::owned(Vec::with_capacity(n), false);
            let (res, buf) = self.ssd.read(view.seg.arc(), view.offset + done, buf).await;
            match res {
                Ok(()) => hash.update(buf.as_slice()),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return IoOutcome::Damaged;
                }
                Err(_) => return IoOutcome::Failed,
            }
            done += n as u64;
        }
        if hash.digest() == sum {
            IoOutcome::Done
        } else {
            IoOutcome::Damaged
        }
    }
}

/// How long a removal waits for its journal record before it is answered all the same.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The journals' thread writes a record tens of microseconds after it is woken: for this long
/// a waiting removal looks again at each turn of the shard's other tasks (a timer's
/// granularity, a millisecond, was the whole cost of a removal: 1.2 ms instead of 0.13).
const SETTLE_SPIN: std::time::Duration = std::time::Duration::from_micros(500);
/// After that, how often it looks.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Lets the shard's other tasks run once: pending once, woken at once.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl Shard {
    /// What the journals hold emitted before a removal runs (`None`: no SSD file is
    /// journaled): [`Shard::journal_settle`] waits for what is emitted after it.
    pub fn journal_mark(&self) -> Option<Vec<u64>> {
        self.shared.journal_mark()
    }

    /// Waits until every journal record emitted since `mark` is on file, so that a removal of
    /// an object flushed to SSD is answered only once a restart can no longer bring it back.
    /// Usually within a write of the journals' thread; past [`SETTLE_LIMIT`] (a disk that
    /// does not answer) the removal is answered all the same, and logged.
    pub async fn journal_settle(&self, mark: Option<Vec<u64>>) {
        let (Some(j), Some(mark)) = (&self.shared.journals, mark) else {
            return;
        };
        let started = Instant::now();
        let deadline = started + SETTLE_LIMIT;
        while !j.settled(&mark) {
            if started.elapsed() < SETTLE_SPIN {
                YieldOnce(false).await;
                continue;
            }
            if Instant::now() > deadline {
                log::warn!(
                    "a removal's SSD journal record was not written within {} s: answered all the same (a restart before it is written may bring the object back)",
                    SETTLE_LIMIT.as_secs()
                );
                return;
            }
            monoio::time::sleep(SETTLE_POLL).await;
        }
    }
}

impl super::Shared {
    /// Logs what the start recovered from each journaled SSD file and how long it held the
    /// start, once every shard accepts (the server is ready from then on).
    pub fn log_ssd_recovery(&self) {
        use crate::metrics::view::DiskFigures;
        for seg in self.segments.snapshot().iter() {
            let Some(r) = seg.backend.file().and_then(|f| f.recovery()) else {
                continue;
            };
            let dropped = r.dropped_length + r.dropped_invalid + r.dropped_conflict;
            log::info!(
                "{}: {} blobs ({} bytes) recovered from the SSD file in {:.1} ms{}; ready: they are listed and readable now, and read back in the background ({} to go)",
                seg.name,
                r.blobs,
                r.bytes,
                r.micros as f64 / 1e3,
                if dropped > 0 {
                    format!(
                        "; {dropped} listed by the journal were dropped ({} past the end of the file or the segment, {} malformed, {} refused by the index)",
                        r.dropped_length, r.dropped_invalid, r.dropped_conflict
                    )
                } else {
                    String::new()
                },
                r.verify_pending
            );
        }
    }
}
