//! The journals' writer: one thread per process appends the records the shards emit to the
//! journal of their SSD file (`journal.rs`), and rewrites a journal whole once it has grown
//! past twice its last snapshot. A shard never touches a journal file: it emits records
//! into its own backlog (`Store::journal_out`), moves them into the bounded lock-free queue
//! here on its next pass, and wakes the thread (an unpark: no syscall unless it sleeps).
//! When the queue is full the records stay in the shard's backlog, in order, until a later
//! pass or tick finds room: no shard waits, no record is lost.
//!
//! Order. Records of one shard reach a journal in the order the shard emitted them. Records
//! of two shards may interleave in any order; the replay does not depend on it (an `Add`
//! replaces what it overlaps, a `Remove` names its blob's stamp).
//!
//! Durability. A record is written with `write(2)` on the thread: once that returned, it
//! survives the process (`kill -9`, a panic, the OOM killer), not a power loss (the file is
//! not synced per record). Each producer numbers its records; the thread publishes, per
//! producer, the number of the last record written (`written`), so a removal can be answered
//! once its record is on file ([`Journals::settled`]).
//!
//! A journal that cannot be written (its disk full, its file gone) is *dropped*: its file is
//! removed, so the next start recovers nothing from that SSD file rather than trusting a
//! journal that misses removals; its records are counted and dropped from then on.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::journal::{self, Record};
use crate::metrics::Counter;

/// Records the queue holds; past it they wait in their shard's backlog.
pub const QUEUE_CAPACITY: usize = 65_536;
/// Records the producers that are no shard (a local service's catalog) may have waiting; past
/// it their journal is dropped (a disk that stopped taking writes: nothing is recovered from
/// it rather than something stale).
pub const SHARED_CAPACITY: usize = 1 << 20;
/// A journal is never rewritten below this size (a snapshot costs a read and a write of the
/// whole file: below a few MB that is not worth the sync it ends with).
pub const MIN_COMPACT_BYTES: u64 = 16 << 20;
/// Records one pass of the thread writes at most before it publishes what it wrote.
const BATCH: usize = 8192;
/// How long the thread sleeps when nothing wakes it (it is woken for every record).
const IDLE: Duration = Duration::from_millis(100);

/// One record on its way: its journal, its producer and that producer's number for it.
pub struct Item {
    pub file: u32,
    pub slot: u16,
    pub seq: u64,
    pub rec: Record,
}

/// A journal's figures (written by the journal thread only, read by scrapes).
#[derive(Default)]
pub struct JournalFigures {
    /// The journal file's size in bytes.
    pub bytes: Counter,
    /// Records appended since the start (snapshots not counted).
    pub records: Counter,
    pub compactions: Counter,
    /// Records dropped because the journal could not be written (it is dropped then).
    pub dropped_records: Counter,
    /// The journal was dropped (see the module's doc).
    pub dead: AtomicBool,
}

/// The journal of one SSD file, as the thread keeps it.
struct FileJournal {
    path: PathBuf,
    capacity: u64,
    file: Option<std::fs::File>,
    len: u64,
    /// The size past which it is rewritten.
    compact_at: u64,
    figures: Arc<JournalFigures>,
}

/// A producer's counter, alone on its cache line.
#[derive(Default)]
#[repr(align(128))]
struct Slot(AtomicU64);

/// The process's journals and their thread.
pub struct Journals {
    queue: ArrayQueue<Item>,
    /// Taken by the journal thread per batch and by a mount registering a journal.
    // LOCK-OK: never by a shard (the journal thread, a mount at start or on the agent)
    files: Mutex<Vec<FileJournal>>,
    thread: OnceLock<std::thread::Thread>,
    // LOCK-OK: taken once, to start the thread, and once to join it.
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Records of the producers that are no shard, in order (their seat is the last slot),
    /// and the journal dropped past [`SHARED_CAPACITY`] (`u32::MAX`: none).
    // LOCK-OK: a local service's catalog changes, pushed under its catalog's lock
    shared: Mutex<std::collections::VecDeque<Item>>,
    shared_overflow: std::sync::atomic::AtomicU32,
    /// Per producer: the number of the last record it emitted (written by that producer).
    emitted: Box<[Slot]>,
    /// Per producer: the number of the last of its records written (by the thread).
    written: Box<[Slot]>,
    stop: AtomicBool,
}

/// A file's handle on its journal (kept by its `SsdFile`).
pub struct JournalLink {
    pub journals: Arc<Journals>,
    pub file: u32,
    pub figures: Arc<JournalFigures>,
}

impl Journals {
    /// The journals of a process with `producers` producers (the shards, and one more for
    /// writers that are no shard: slot `producers - 1`). The thread starts with the first
    /// registered journal.
    pub fn new(producers: usize) -> Arc<Journals> {
        Arc::new(Journals {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            files: Mutex::new(Vec::new()), // LOCK-OK: see `files`
            thread: OnceLock::new(),
            handle: Mutex::new(None),               // LOCK-OK: see `handle`
            shared: Mutex::new(Default::default()), // LOCK-OK: see `shared`
            shared_overflow: std::sync::atomic::AtomicU32::new(u32::MAX),
            emitted: (0..producers.max(1)).map(|_| Slot::default()).collect(),
            written: (0..producers.max(1)).map(|_| Slot::default()).collect(),
            stop: AtomicBool::new(false),
        })
    }

    /// Registers the journal at `path` (of a segment of `capacity` bytes), opened for
    /// appending at `len` bytes (a snapshot just written), and starts the thread if needed.
    pub fn register(
        self: &Arc<Self>,
        path: PathBuf,
        capacity: u64,
        file: std::fs::File,
        len: u64,
    ) -> std::io::Result<JournalLink> {
        let figures = Arc::new(JournalFigures::default());
        figures.bytes.set(len);
        let id = {
            let mut files = self.lock();
            files.push(FileJournal {
                path,
                capacity,
                file: Some(file),
                len,
                compact_at: MIN_COMPACT_BYTES.max(2 * len),
                figures: figures.clone(),
            });
            files.len() as u32 - 1
        };
        self.start()?;
        Ok(JournalLink {
            journals: self.clone(),
            file: id,
            figures,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<FileJournal>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let mut handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        if handle.is_some() || self.stop.load(Acquire) {
            return Ok(());
        }
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("mmc-ssd-journal".into())
            .spawn(move || me.run())?;
        let _ = self.thread.set(h.thread().clone());
        *handle = Some(h);
        Ok(())
    }

    /// The slot of producers that are no shard.
    pub fn shared_slot(&self) -> u16 {
        (self.emitted.len() - 1) as u16
    }

    /// Producer `slot` emitted its record number `seq` (the producer's own counter).
    pub fn note_emitted(&self, slot: u16, seq: u64) {
        if let Some(s) = self.emitted.get(slot as usize) {
            s.0.store(seq, Release);
        }
    }

    /// Queues records of a producer that is no shard for journal `file` (the caller holds the
    /// lock that orders them: a local service's catalog), and wakes the thread.
    pub fn push_shared(&self, file: u32, recs: impl IntoIterator<Item = Record>) {
        let slot = self.shared_slot();
        let mut q = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let mut seq = self.emitted[slot as usize].0.load(Acquire);
        for rec in recs {
            seq += 1;
            q.push_back(Item {
                file,
                slot,
                seq,
                rec,
            });
        }
        self.note_emitted(slot, seq);
        if q.len() > SHARED_CAPACITY {
            q.clear();
            self.shared_overflow.store(file, Release);
        }
        drop(q);
        self.wake();
    }

    /// Queues a record; gives it back when the queue is full (the caller keeps it, in order).
    pub fn try_push(&self, item: Item) -> Result<(), Item> {
        self.queue.push(item)
    }

    /// Wakes the thread (after pushing).
    pub fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// What every producer has emitted so far: a removal takes this before it runs.
    pub fn mark(&self) -> Vec<u64> {
        self.emitted.iter().map(|s| s.0.load(Acquire)).collect()
    }

    /// Whether every record emitted between `mark` and now is on file (a journal that was
    /// dropped counts as on file: nothing is recovered from it).
    pub fn settled(&self, mark: &[u64]) -> bool {
        self.emitted
            .iter()
            .zip(&self.written)
            .zip(mark)
            .all(|((e, w), &m)| {
                let e = e.0.load(Acquire);
                e == m || w.0.load(Acquire) >= e
            })
    }

    /// Writes what is queued, then stops the thread (the shards are gone).
    pub fn stop(&self) {
        self.stop.store(true, Release);
        self.wake();
        let h = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    fn run(&self) {
        let mut bufs: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut last: HashMap<u16, u64> = HashMap::new();
        loop {
            let mut n = 0;
            let mut take = |it: Item| {
                journal::encode(&it.rec, bufs.entry(it.file).or_default());
                last.insert(it.slot, it.seq);
            };
            while n < BATCH {
                let Some(it) = self.queue.pop() else { break };
                take(it);
                n += 1;
            }
            let shared =
                std::mem::take(&mut *self.shared.lock().unwrap_or_else(|p| p.into_inner()));
            n += shared.len();
            shared.into_iter().for_each(&mut take);
            let overflow = self.shared_overflow.swap(u32::MAX, Relaxed);
            if overflow != u32::MAX
                && let Some(f) = self.lock().get_mut(overflow as usize)
            {
                f.drop_journal("its records came faster than the disk took them");
            }
            if n == 0 {
                if self.stop.load(Acquire) {
                    return;
                }
                std::thread::park_timeout(IDLE);
                continue;
            }
            {
                let mut files = self.lock();
                for (&id, buf) in bufs.iter_mut().filter(|(_, b)| !b.is_empty()) {
                    if let Some(f) = files.get_mut(id as usize) {
                        f.append(buf);
                    }
                    buf.clear();
                }
            }
            for (slot, seq) in last.drain() {
                if let Some(w) = self.written.get(slot as usize) {
                    w.0.store(seq, Release);
                }
            }
            // After publishing what was written: a removal waits for its record only, not
            // for a rewrite (records that come meanwhile wait for it, in the queue).
            for f in self.lock().iter_mut() {
                if f.file.is_some() && f.len > f.compact_at {
                    f.compact();
                }
            }
        }
    }
}

impl FileJournal {
    /// Appends `buf` (whole records); a journal that cannot be written is dropped. Past
    /// `compact_at` the thread rewrites it ([`FileJournal::compact`]) once the pass published
    /// what it wrote.
    fn append(&mut self, buf: &[u8]) {
        let records = count_records(buf);
        let Some(file) = self.file.as_mut() else {
            self.figures.dropped_records.add(records);
            return;
        };
        if let Err(e) = file.write_all(buf) {
            self.drop_journal(&format!("appending to it failed: {e}"));
            self.figures.dropped_records.add(records);
            return;
        }
        self.len += buf.len() as u64;
        self.figures.bytes.set(self.len);
        self.figures.records.add(records);
    }

    /// Rewrites the journal as a snapshot of its live entries.
    fn compact(&mut self) {
        let started = std::time::Instant::now();
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) => {
                return self.drop_journal(&format!("reading it back to rewrite it failed: {e}"));
            }
        };
        let replayed = journal::replay(&bytes);
        if replayed.tail_bytes != 0 {
            return self.drop_journal("it does not read back whole");
        }
        let snap = journal::snapshot(self.capacity, replayed.entries.values());
        match journal::replace(&self.path, &snap) {
            Ok(f) => {
                log::info!(
                    "SSD journal {} rewritten: {} to {} bytes ({} blobs) in {:.1} ms",
                    self.path.display(),
                    bytes.len(),
                    snap.len(),
                    replayed.entries.len(),
                    started.elapsed().as_secs_f64() * 1e3
                );
                self.file = Some(f);
                self.len = snap.len() as u64;
                self.compact_at = MIN_COMPACT_BYTES.max(2 * self.len);
                self.figures.bytes.set(self.len);
                self.figures.compactions.inc();
            }
            Err(e) => self.drop_journal(&format!("rewriting it failed: {e}")),
        }
    }

    fn drop_journal(&mut self, why: &str) {
        if self.figures.dead.load(Relaxed) {
            return;
        }
        self.file = None;
        let removed = std::fs::remove_file(&self.path);
        self.figures.dead.store(true, Relaxed);
        self.figures.bytes.set(0);
        log::error!(
            "SSD journal {}: {why}; it is dropped{} (the SSD tier keeps working; its blobs will not be recovered at the next start)",
            self.path.display(),
            match removed {
                Ok(()) => String::new(),
                Err(e) => format!(" but cannot be removed ({e}): remove it before the next start"),
            }
        );
    }
}

/// The records framed in `buf` (whole records, as encoded).
fn count_records(buf: &[u8]) -> u64 {
    let mut n = 0;
    let mut at = 0;
    while let Some(len) = buf.get(at..at + 4) {
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        at += 12 + len;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::catalog::{Entry, Stamp};
    use crate::common::medium::Medium;

    fn add(offset: u64, seq: u64) -> Record {
        Record::Add {
            shard: 0,
            entry: Entry {
                key: format!("k{offset}").into_bytes().into(),
                medium: Medium::Ssd,
                offset,
                len: 4096,
                size: 10,
                stamp: Stamp { view: 0, seq },
                sum: 1,
            },
        }
    }

    #[test]
    fn the_thread_writes_records_in_order_publishes_progress_and_compacts() {
        let dir = std::env::temp_dir().join(format!("mmc-journaling-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j.journal");
        let snap = journal::header(1 << 40).to_vec();
        let f = journal::replace(&path, &snap).unwrap();
        let j = Journals::new(2);
        let link = j
            .register(path.clone(), 1 << 40, f, snap.len() as u64)
            .unwrap();
        let mark = j.mark();
        assert!(j.settled(&mark));
        // Enough adds and removes of the same ranges to pass the compaction threshold.
        let mut seq = 0;
        let per_round = 1000u64;
        let rounds = (MIN_COMPACT_BYTES / (per_round * 90)) + 5;
        for round in 0..rounds {
            for i in 0..per_round {
                let offset = i * 4096;
                for rec in [
                    add(offset, round * per_round + i),
                    Record::Remove {
                        shard: 0,
                        offset,
                        stamp: Stamp {
                            view: 0,
                            seq: round * per_round + i,
                        },
                    },
                ] {
                    seq += 1;
                    j.note_emitted(0, seq);
                    let mut item = Item {
                        file: link.file,
                        slot: 0,
                        seq,
                        rec,
                    };
                    while let Err(back) = j.try_push(item) {
                        item = back;
                        j.wake();
                        std::thread::yield_now();
                    }
                }
            }
            j.wake();
        }
        // One live entry left at the end.
        seq += 1;
        j.note_emitted(0, seq);
        // Emitted and not pushed yet: it cannot be on file.
        assert!(!j.settled(&mark));
        let mut item = Item {
            file: link.file,
            slot: 0,
            seq,
            rec: add(0, 1 << 40),
        };
        // The queue may still be full of the last round's records (a loaded machine).
        while let Err(back) = j.try_push(item) {
            item = back;
            j.wake();
            std::thread::yield_now();
        }
        j.wake();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !j.settled(&mark) {
            assert!(std::time::Instant::now() < deadline, "never settled");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(link.figures.records.get(), seq);
        assert!(link.figures.compactions.get() >= 1);
        let r = journal::replay(&std::fs::read(&path).unwrap());
        assert_eq!(r.tail_bytes, 0);
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.entries[&0].entry.stamp.seq, 1 << 40);
        assert!(std::fs::metadata(&path).unwrap().len() < MIN_COMPACT_BYTES);
        j.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn records_are_counted_by_their_frames() {
        let mut b = Vec::new();
        for i in 0..7 {
            journal::encode(&add(i * 4096, i), &mut b);
        }
        journal::encode(&Record::Clear { shard: 3 }, &mut b);
        assert_eq!(count_records(&b), 8);
    }
}
