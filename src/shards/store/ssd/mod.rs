//! The SSD tier's files and their asynchronous I/O.
//!
//! Each SSD segment is one sparse file, `mmc-rank-<r>.ssd`, in a configured directory. Blobs
//! are flushed to it and read back (rewarm) without a blocking syscall on a shard thread: on
//! the io_uring driver through the ring (monoio's file ops), on the epoll driver through a
//! small pool of I/O threads. With `ock.mmc.ssd.recover` (the default) the index of each
//! file is journaled beside it (`journal.rs`, written by `journaling.rs`'s thread) and a start
//! on the same path finds its blobs again (`recover.rs`); without it files are recreated
//! empty at start.
//!
//! Errors are counted per file, logged once per (operation, cause), and marked in the disk's
//! status. A failed write marks the file *faulted*: it takes no flushes (the memory tiers then
//! evict by deleting) until a probe write, tried once per [`PROBE_INTERVAL_MS`] from the
//! housekeeping tick, succeeds again. Every flushed blob's checksum (xxh3-64 of its bytes) is
//! kept with the blob and checked on every read back: a mismatch or a short read means the
//! copy is damaged (the file was truncated or overwritten behind the server's back), and the
//! copy is dropped instead of served.
//!
//! `MMC_FAULT_SSD_WRITE` / `MMC_FAULT_SSD_READ` (`enospc`, `eio`, `erofs`, optionally `@N`:
//! from the N-th operation on, or `@N..M`: the N-th to the M-th) inject failures for tests;
//! probe writes count as writes.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

mod buffer;
pub use buffer::IoBuffer;
pub mod journal;
pub mod journaling;
mod pool;
pub mod recover;

use super::segment::{Segment, SegmentId};
use crate::common::clock::Clock;
use crate::metrics::window::RateWindow;
use crate::metrics::{Counter, Gauge};
pub use pool::IO_QUEUE_CAPACITY;
use pool::{Job, pool};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    Read,
    Write,
    /// A probe write of a faulted file (see [`probe`]).
    Probe,
}

/// How often a faulted file is probed (from the housekeeping tick, by one shard).
pub const PROBE_INTERVAL_MS: u64 = 1000;

/// The checksum kept for every blob flushed to SSD and checked when it is read back.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// One injected failure: an errno for the operations numbered `from..=to` (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FaultRule {
    errno: i32,
    from: u64,
    to: u64,
}

/// Injected failures, from the environment (tests).
#[derive(Default)]
struct Faults {
    write: Option<FaultRule>,
    read: Option<FaultRule>,
    writes_seen: AtomicU64,
    reads_seen: AtomicU64,
}

fn parse_fault(var: &str) -> Option<FaultRule> {
    parse_fault_rule(&std::env::var(var).ok()?)
}

/// `cause[@N]` (from the N-th operation on) or `cause@N..M` (the N-th to the M-th).
fn parse_fault_rule(v: &str) -> Option<FaultRule> {
    let (cause, from, to) = match v.split_once('@') {
        Some((c, range)) => match range.split_once("..") {
            Some((a, b)) => (c, a.parse().unwrap_or(1), b.parse().unwrap_or(u64::MAX)),
            None => (c, range.parse().unwrap_or(1), u64::MAX),
        },
        None => (v, 1, u64::MAX),
    };
    let errno = match cause.to_ascii_lowercase().as_str() {
        "enospc" => libc::ENOSPC,
        "eio" => libc::EIO,
        "erofs" => libc::EROFS,
        _ => return None,
    };
    Some(FaultRule {
        errno,
        from: from.max(1),
        to,
    })
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| Faults {
        write: parse_fault("MMC_FAULT_SSD_WRITE"),
        read: parse_fault("MMC_FAULT_SSD_READ"),
        ..Faults::default()
    })
}

fn injected(op: IoOp) -> Option<io::Error> {
    let f = faults();
    let (rule, seen) = match op {
        IoOp::Write | IoOp::Probe => (f.write, &f.writes_seen),
        IoOp::Read => (f.read, &f.reads_seen),
    };
    let rule = rule?;
    let n = seen.fetch_add(1, Relaxed) + 1;
    (rule.from..=rule.to)
        .contains(&n)
        .then(|| io::Error::from_raw_os_error(rule.errno))
}

/// One shard's I/O figures for one SSD file: written only by that shard (its reads, flushes
/// and rewarms finish on its thread), summed when read.
#[derive(Default)]
#[repr(align(128))]
pub struct SsdShardStats {
    pub bytes_read: Counter,
    pub bytes_written: Counter,
    pub read_errors: Counter,
    pub write_errors: Counter,
    /// Reads whose bytes failed their checksum or came back short (copies dropped).
    pub damaged_reads: Counter,
    /// Bytes read and written per second, for the disk bandwidth gauges.
    pub read_window: RateWindow,
    pub write_window: RateWindow,
    /// Recovered blobs this shard took into its index at the start, and their bytes.
    pub recovered: Counter,
    pub recovered_bytes: Counter,
    /// Recovered blobs this shard could not index (their range taken, their key twice).
    pub recover_refused: Counter,
    /// Recovered blobs whose bytes were read back and matched their checksum.
    pub verified: Counter,
    /// Recovered blobs whose bytes did not match (or came back short): dropped.
    pub verify_damaged: Counter,
    /// Recovered blobs still to read back.
    pub verify_pending: Gauge,
}

/// What the start found in the file's journal (written once, by the thread that opened it).
#[derive(Default)]
pub struct RecoveryFigures {
    /// Blobs the journal listed that were dropped at once: past the end of the file or
    /// outside the segment (`length`), malformed (`invalid`).
    pub dropped_length: Counter,
    pub dropped_invalid: Counter,
    /// Bytes at the end of the journal that did not read as intact records (ignored).
    pub journal_tail_bytes: Counter,
    /// How long reading the journal and rewriting it took (µs); the shards' indexing adds
    /// its own time (`SsdFile::index_micros`).
    pub open_micros: Counter,
}

/// One SSD segment's file.
pub struct SsdFile {
    pub path: PathBuf,
    /// The directory, as configured (the `disk_path` label).
    pub dir: String,
    file: std::fs::File,
    /// Per shard (index: shard id), so no two shards write one counter.
    stats: Box<[SsdShardStats]>,
    /// The segment's size: probes write just past it, where no blob lives.
    capacity: u64,
    /// 0 when the file takes flushes; else the errno of the write that faulted it (cleared
    /// only by a successful probe write).
    write_fault: AtomicU8,
    /// 0 normal; else the errno of the last failed read (cleared by the next good read).
    read_status: AtomicU8,
    /// When the next probe of a faulted file is due (ms since start; 0: not scheduled yet,
    /// the first tick after a fault schedules it one interval later). One shard takes it.
    next_probe_ms: AtomicU64,
    logged: Mutex<HashSet<(IoOp, i32)>>, // LOCK-OK: only when an I/O error is logged
    /// The journal of the file's index (`None`: the file is not recovered at the next start).
    journal: Option<journaling::JournalLink>,
    /// What the start recovered from it.
    pub recovery: RecoveryFigures,
    /// Per shard: how long indexing its share of the recovered blobs took (µs).
    index_micros: Box<[Counter]>,
    /// The recovered blobs each shard takes into its index at its start.
    recovered: Mutex<Vec<Vec<crate::cluster::catalog::Entry>>>, // LOCK-OK: once per shard, at its start
}

/// The `errno` key under which damaged reads are logged once.
const DAMAGED: i32 = -2;

impl SsdFile {
    /// The path of rank `rank`'s file in `dir`.
    pub fn path_in(dir: &str, rank: u32) -> PathBuf {
        Path::new(dir).join(format!("mmc-rank-{rank}.ssd"))
    }

    /// Creates (or empties) the rank's file in `dir`, sized (sparsely) to `capacity`, with
    /// figures for `shards` shards. Not journaled: a journal left beside it by an earlier
    /// start is removed (its entries name bytes that are gone).
    pub fn create(dir: &str, rank: u32, capacity: u64, shards: usize) -> io::Result<SsdFile> {
        let (path, file) = SsdFile::open_locked(dir, rank, capacity)?;
        if file.metadata()?.len() > 0 {
            log::info!(
                "SSD file {} emptied: this segment starts empty (ock.mmc.ssd.recover = false, or a mount at run time)",
                path.display()
            );
        }
        file.set_len(0)?;
        file.set_len(capacity)?;
        match std::fs::remove_file(journal::path_for(&path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(SsdFile::with_file(path, dir, file, capacity, shards))
    }

    /// Opens (or creates) rank `rank`'s file in `dir` as it is, locked for this process
    /// ([`lock_exclusively`]); warns when the file system has less room than `capacity`.
    /// What it creates, the directory and the file, is logged with its path and size.
    fn open_locked(dir: &str, rank: u32, capacity: u64) -> io::Result<(PathBuf, std::fs::File)> {
        if !Path::new(dir).is_dir() {
            std::fs::create_dir_all(dir)?;
            log::info!("SSD directory {dir} created");
        }
        warn_if_short_of_space(dir, capacity);
        let path = SsdFile::path_in(dir, rank);
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        lock_exclusively(&file, &path)?;
        log::info!(
            "SSD file {} {} for rank {rank}'s SSD segment: {} (ock.mmc.ssd.size; a sparse file, its disk blocks taken as blobs are flushed)",
            path.display(),
            if existed { "opened" } else { "created" },
            crate::common::fmt::size_text(capacity)
        );
        Ok((path, file))
    }

    /// The file's record around an open `file` (locked with [`lock_exclusively`]).
    fn with_file(
        path: PathBuf,
        dir: &str,
        file: std::fs::File,
        capacity: u64,
        shards: usize,
    ) -> SsdFile {
        SsdFile {
            path,
            dir: dir.to_string(),
            file,
            stats: (0..shards.max(1))
                .map(|_| SsdShardStats::default())
                .collect(),
            capacity,
            write_fault: AtomicU8::new(0),
            read_status: AtomicU8::new(0),
            next_probe_ms: AtomicU64::new(0),
            logged: Mutex::new(HashSet::new()), // LOCK-OK: see `logged`
            journal: None,
            recovery: RecoveryFigures::default(),
            index_micros: (0..shards.max(1)).map(|_| Counter::default()).collect(),
            recovered: Mutex::new(Vec::new()), // LOCK-OK: see `recovered`
        }
    }

    /// The journal of this file's index, when it keeps one.
    pub fn journal(&self) -> Option<&journaling::JournalLink> {
        self.journal.as_ref()
    }

    /// Recovered blobs no shard has taken yet.
    pub fn recovered_pending(&self) -> usize {
        let r = self.recovered.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().map(Vec::len).sum()
    }

    /// Shard `shard`'s share of the blobs recovered at the start (empty after the first call).
    pub fn take_recovered(&self, shard: usize) -> Vec<crate::cluster::catalog::Entry> {
        let mut r = self.recovered.lock().unwrap_or_else(|p| p.into_inner());
        r.get_mut(shard).map(std::mem::take).unwrap_or_default()
    }

    /// Shard `shard` indexed its share of the recovered blobs in `micros`.
    pub fn record_index_time(&self, shard: usize, micros: u64) {
        if let Some(c) = self.index_micros.get(shard) {
            c.set(micros);
        }
    }

    /// How long the recovery of this file held the start (µs): opening and rewriting the
    /// journal, then the slowest shard's indexing.
    pub fn recovery_micros(&self) -> u64 {
        self.recovery.open_micros.get()
            + self
                .index_micros
                .iter()
                .map(Counter::get)
                .max()
                .unwrap_or(0)
    }

    /// The disk's status (`memcache_ubs_io_disk_status`): 0 normal, else an errno: the one
    /// that faulted the file's writes, else the last failed read's.
    pub fn status(&self) -> u8 {
        match self.write_fault.load(Relaxed) {
            0 => self.read_status.load(Relaxed),
            e => e,
        }
    }

    /// A write failed and no probe write has succeeded since: the file takes no flushes.
    pub fn faulted(&self) -> bool {
        self.write_fault.load(Relaxed) != 0
    }

    /// Whether this caller should probe the faulted file now (`now_ms`: ms since start).
    /// True for one caller per [`PROBE_INTERVAL_MS`], the first one interval after the fault.
    pub fn probe_due(&self, now_ms: u64) -> bool {
        if !self.faulted() {
            return false;
        }
        let next = self.next_probe_ms.load(Relaxed);
        let swapped = (next == 0 || now_ms >= next)
            && self
                .next_probe_ms
                .compare_exchange(next, now_ms + PROBE_INTERVAL_MS, Relaxed, Relaxed)
                .is_ok();
        swapped && next != 0
    }

    /// Records a probe's result: success clears the fault (flushes resume).
    pub fn finish_probe(&self, res: &io::Result<()>) {
        match res {
            Ok(()) => {
                let was = self.write_fault.swap(0, Relaxed);
                self.next_probe_ms.store(0, Relaxed);
                if was != 0 {
                    log::warn!(
                        "SSD file {} takes writes again (a probe write succeeded): flushes resume",
                        self.path.display()
                    );
                }
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(-1);
                self.write_fault.store(errno.clamp(1, 255) as u8, Relaxed);
                // Logged under the writes' cause: a probe failing as the writes did is no news.
                self.log_once(IoOp::Write, errno, || {
                    format!(
                        "SSD probe write of {} failed: {e}; the file stays faulted (further write errors with this cause are not logged)",
                        self.path.display()
                    )
                });
            }
        }
    }

    /// The figures of every shard, to sum.
    pub fn shard_stats(&self) -> &[SsdShardStats] {
        &self.stats
    }

    /// Bytes read and written in the `secs` seconds up to `now_secs`, all shards.
    pub fn window_bytes(&self, now_secs: u64, secs: u64) -> (u64, u64) {
        self.stats.iter().fold((0, 0), |(r, w), s| {
            (
                r + s.read_window.sum(now_secs, secs),
                w + s.write_window.sum(now_secs, secs),
            )
        })
    }

    /// A read came back damaged (checksum mismatch or short read): counted (by `shard`, on its
    /// thread), logged once.
    pub fn record_damaged(&self, shard: usize, what: &str) {
        self.stats[shard].damaged_reads.inc();
        self.log_once(IoOp::Read, DAMAGED, || {
            format!(
                "SSD file {} returned damaged data ({what}): the copy is dropped and the read answers an error (further damaged reads are counted, not logged)",
                self.path.display()
            )
        });
    }

    fn log_once(&self, op: IoOp, cause: i32, line: impl FnOnce() -> String) {
        let first = self
            .logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((op, cause));
        if first {
            log::error!("{}", line());
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Counts an operation's outcome in `shard`'s figures (on that shard's thread).
    fn record(&self, shard: usize, now_secs: u64, op: IoOp, res: &io::Result<()>, bytes: usize) {
        let stats = &self.stats[shard];
        match res {
            Ok(()) => {
                let (c, w) = if op == IoOp::Read {
                    (&stats.bytes_read, &stats.read_window)
                } else {
                    (&stats.bytes_written, &stats.write_window)
                };
                c.add(bytes as u64);
                w.add(now_secs, bytes as u64);
                if op == IoOp::Read {
                    self.read_status.store(0, Relaxed);
                }
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(-1);
                let code = errno.clamp(1, 255) as u8;
                // A failed write (or probe) marks the file faulted; a failed read is reported.
                let (errors, status, what, kind, then) = if op == IoOp::Read {
                    (&stats.read_errors, &self.read_status, "read", "Read", "")
                } else {
                    (
                        &stats.write_errors,
                        &self.write_fault,
                        "write",
                        "Write",
                        "; the file is marked faulted and takes no flushes (memory evicts by deleting) until a probe write succeeds",
                    )
                };
                errors.inc();
                status.store(code, Relaxed);
                self.log_once(op, errno, || {
                    format!(
                        "SSD {what} of {} failed: {e}{then} (further {kind} errors with this cause are counted, not logged)",
                        self.path.display()
                    )
                });
            }
        }
    }
}

/// Takes an exclusive `flock` on an SSD file without waiting, so that a second server on the
/// same path is refused rather than let write into it. The lock goes with the file's last
/// descriptor (the unmount, or the process's end: a `kill -9` too).
fn lock_exclusively(file: &std::fs::File, path: &Path) -> io::Result<()> {
    // SAFETY: a plain syscall on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        io::Error::other(format!(
            "{} is in use by another process (a server still running on this path)",
            path.display()
        ))
    } else {
        e
    })
}

/// Warns when the directory's file system has less room than the segment may fill.
fn warn_if_short_of_space(dir: &str, capacity: u64) {
    let Ok(c) = std::ffi::CString::new(dir) else {
        return;
    };
    // SAFETY: statvfs writes into the zeroed struct; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return;
    }
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    if free < capacity {
        log::warn!(
            "SSD directory {dir} has {free} bytes free, less than ock.mmc.ssd.size ({capacity} bytes): once it is full, flushes fail, the SSD file is marked faulted and memory evicts by deleting"
        );
    }
}

/// Probes a faulted SSD file: writes a page just past the segment's end (where no blob
/// lives, and where a full file system has no page to give) and punches it out again. Runs
/// on the I/O threads (a shard thread never blocks on a file).
pub async fn probe(seg: &Arc<Segment>) -> io::Result<()> {
    let file = seg.backend.file().expect("an SSD segment");
    if let Some(e) = injected(IoOp::Probe) {
        return Err(e);
    }
    let (tx, rx) = flume::bounded(1);
    let job = Job {
        fd: file.raw_fd(),
        op: IoOp::Probe,
        offset: file.capacity,
        buf: IoBuffer::owned(vec![0u8; 4096], true),
        done: tx,
    };
    if pool().send_async(job).await.is_err() {
        return Err(io::Error::other("SSD I/O pool stopped"));
    }
    match rx.recv_async().await {
        Ok((r, _)) => r,
        Err(_) => Err(io::Error::other("SSD I/O pool dropped a request")),
    }
}

/// A shard's access to SSD files: its I/O path and what it counts its operations under.
pub struct SsdIo {
    shard: usize,
    clock: Clock,
    path: IoPath,
}

/// The way a shard's file operations go, chosen by its io driver.
enum IoPath {
    /// io_uring: file operations go through the shard's ring, on a descriptor per segment
    /// that this shard opened (monoio files belong to one runtime).
    Ring(RefCell<HashMap<SegmentId, Rc<monoio::fs::File>>>),
    /// epoll: file operations run on the I/O thread pool.
    Pool,
}

impl SsdIo {
    /// Writes all of `buf` at `offset`.
    pub async fn write(
        &self,
        seg: &Arc<Segment>,
        offset: u64,
        buf: IoBuffer,
    ) -> (io::Result<()>, IoBuffer) {
        let len = buf.len();
        self.counted(seg, IoOp::Write, offset, buf, len).await
    }

    /// Fills `buf` (its full capacity) from `offset`.
    pub async fn read(
        &self,
        seg: &Arc<Segment>,
        offset: u64,
        buf: IoBuffer,
    ) -> (io::Result<()>, IoBuffer) {
        let len = buf.cap;
        self.counted(seg, IoOp::Read, offset, buf, len).await
    }

    /// Runs `op` of `len` bytes (or fails it, when a fault is injected) and counts it in this
    /// shard's figures for the file.
    async fn counted(
        &self,
        seg: &Arc<Segment>,
        op: IoOp,
        offset: u64,
        buf: IoBuffer,
        len: usize,
    ) -> (io::Result<()>, IoBuffer) {
        let file = seg.backend.file().expect("an SSD segment");
        let (res, buf) = match injected(op) {
            Some(e) => (Err(e), buf),
            None => self.run(seg, op, offset, buf).await,
        };
        file.record(self.shard, self.clock.now_secs(), op, &res, len);
        (res, buf)
    }

    /// Shard `shard`'s access, on the io_uring driver (`uring`) or the epoll driver.
    pub fn new(uring: bool, shard: usize, clock: Clock) -> SsdIo {
        let path = if uring {
            IoPath::Ring(RefCell::new(HashMap::new()))
        } else {
            IoPath::Pool
        };
        SsdIo { shard, clock, path }
    }

    /// Forgets this shard's descriptor of an unmounted segment.
    pub fn forget(&self, seg: SegmentId) {
        if let IoPath::Ring(files) = &self.path {
            files.borrow_mut().remove(&seg);
        }
    }

    async fn run(
        &self,
        seg: &Arc<Segment>,
        op: IoOp,
        offset: u64,
        buf: IoBuffer,
    ) -> (io::Result<()>, IoBuffer) {
        let file = seg.backend.file().expect("an SSD segment");
        match &self.path {
            IoPath::Ring(files) => {
                let existing = files.borrow().get(&seg.id).cloned();
                let f = match existing {
                    Some(f) => f,
                    None => match file.file.try_clone().and_then(monoio::fs::File::from_std) {
                        Ok(f) => {
                            let f = Rc::new(f);
                            files.borrow_mut().insert(seg.id, f.clone());
                            f
                        }
                        Err(e) => return (Err(e), buf),
                    },
                };
                match op {
                    IoOp::Write | IoOp::Probe => f.write_all_at(buf, offset).await,
                    IoOp::Read => f.read_exact_at(buf, offset).await,
                }
            }
            IoPath::Pool => {
                let (tx, rx) = flume::bounded(1);
                let job = Job {
                    fd: file.raw_fd(),
                    op,
                    offset,
                    buf,
                    done: tx,
                };
                if let Err(flume::SendError(job)) = pool().send_async(job).await {
                    return (Err(io::Error::other("SSD I/O pool stopped")), job.buf);
                }
                match rx.recv_async().await {
                    Ok(r) => r,
                    Err(_) => (
                        Err(io::Error::other("SSD I/O pool dropped a request")),
                        IoBuffer::owned(Vec::new(), false),
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_rules_parse() {
        let r = |errno, from, to| Some(FaultRule { errno, from, to });
        assert_eq!(parse_fault_rule("eio"), r(libc::EIO, 1, u64::MAX));
        assert_eq!(parse_fault_rule("ENOSPC@3"), r(libc::ENOSPC, 3, u64::MAX));
        assert_eq!(parse_fault_rule("erofs@2..5"), r(libc::EROFS, 2, 5));
        assert_eq!(parse_fault_rule("eio@0"), r(libc::EIO, 1, u64::MAX));
        assert_eq!(parse_fault_rule("bogus"), None);
    }

    #[test]
    fn a_failed_write_faults_the_file_until_a_probe_succeeds() {
        let dir = std::env::temp_dir().join(format!("mmc-ssd-unit-{}", std::process::id()));
        let f = SsdFile::create(dir.to_str().unwrap(), 0, 1 << 20, 1).unwrap();
        assert!(!f.faulted());
        assert!(!f.probe_due(0), "nothing to probe");
        f.record(
            0,
            0,
            IoOp::Write,
            &Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            4096,
        );
        assert!(f.faulted());
        assert_eq!(f.status(), libc::ENOSPC as u8);
        // Reads that succeed do not clear a write fault; writes neither (only a probe does).
        f.record(0, 0, IoOp::Read, &Ok(()), 4096);
        f.record(0, 0, IoOp::Write, &Ok(()), 4096);
        assert_eq!(f.status(), libc::ENOSPC as u8);
        // The first tick schedules the probe one interval later; one caller takes it.
        assert!(!f.probe_due(100));
        assert!(!f.probe_due(100 + PROBE_INTERVAL_MS - 1));
        assert!(f.probe_due(100 + PROBE_INTERVAL_MS));
        assert!(!f.probe_due(100 + PROBE_INTERVAL_MS));
        f.finish_probe(&Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(f.status(), libc::EIO as u8);
        f.finish_probe(&Ok(()));
        assert!(!f.faulted());
        assert_eq!(f.status(), 0);
        // A read error shows in the status until the next good read.
        f.record(
            0,
            0,
            IoOp::Read,
            &Err(io::Error::from_raw_os_error(libc::EIO)),
            4096,
        );
        assert_eq!(f.status(), libc::EIO as u8);
        assert!(!f.faulted());
        f.record(0, 0, IoOp::Read, &Ok(()), 4096);
        assert_eq!(f.status(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_shard_counts_its_own_operations_and_a_reader_sums_them() {
        let dir = std::env::temp_dir().join(format!("mmc-ssd-shards-{}", std::process::id()));
        let f = SsdFile::create(dir.to_str().unwrap(), 0, 1 << 20, 2).unwrap();
        f.record(0, 10, IoOp::Write, &Ok(()), 4096);
        f.record(1, 10, IoOp::Write, &Ok(()), 8192);
        f.record(1, 11, IoOp::Read, &Ok(()), 100);
        f.record(
            0,
            11,
            IoOp::Read,
            &Err(io::Error::from_raw_os_error(libc::EIO)),
            7,
        );
        let s = f.shard_stats();
        assert_eq!(s[0].bytes_written.get(), 4096);
        assert_eq!(s[1].bytes_written.get(), 8192);
        assert_eq!((s[0].read_errors.get(), s[1].read_errors.get()), (1, 0));
        assert_eq!((s[0].bytes_read.get(), s[1].bytes_read.get()), (0, 100));
        assert_eq!(f.window_bytes(11, 2), (100, 4096 + 8192));
        assert_eq!(f.window_bytes(11, 1), (100, 0));
        f.record_damaged(1, "test");
        assert_eq!(s[1].damaged_reads.get(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
