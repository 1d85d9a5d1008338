//! The SSD tier's files and their asynchronous I/O.
//!
//! Each SSD segment is one sparse file, `mmc-rank-<r>.ssd`, in a configured directory. Blobs
//! are flushed to it and read back (rewarm) without a blocking syscall on a shard thread: on
//! the io_uring driver through the ring (monoio's file ops), on the epoll driver through a
//! small pool of I/O threads. The SSD tier is a cache, not a durable store: files are
//! recreated empty at start.
//!
//! Errors are counted per file, logged once per (operation, cause), and marked in the disk's
//! status; `MMC_FAULT_SSD_WRITE` / `MMC_FAULT_SSD_READ` (`enospc`, `eio`, optionally `@N`:
//! from the N-th operation on) inject them for tests.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::segment::{Segment, SegmentId};
use crate::metrics::window::RateWindow;

/// A buffer for file I/O that is either owned or a view into a segment's host memory (so a
/// DRAM blob is flushed and rewarmed without an extra copy). Moves between threads with its
/// owner, as the ring and the I/O pool need.
pub struct IoBuffer {
    ptr: *mut u8,
    cap: usize,
    init: usize,
    _owner: Owner,
}

enum Owner {
    Vec(#[allow(dead_code)] Vec<u8>),
    Segment(#[allow(dead_code)] Arc<Segment>),
}

// SAFETY: the pointer is into memory the buffer keeps alive (its Vec or its segment's mapping).
unsafe impl Send for IoBuffer {}

impl IoBuffer {
    /// An owned buffer of `len` bytes to read into, or holding `data` to write.
    pub fn owned(mut data: Vec<u8>, init: bool) -> IoBuffer {
        let cap = if init { data.len() } else { data.capacity() };
        let init_len = if init { data.len() } else { 0 };
        let ptr = data.as_mut_ptr();
        IoBuffer {
            ptr,
            cap,
            init: init_len,
            _owner: Owner::Vec(data),
        }
    }

    /// A view of `[offset, offset + len)` of a host-memory segment.
    ///
    /// # Safety
    /// The range belongs to a blob the caller keeps pinned (for writes to the file) or owns
    /// (ALLOCATED, for reads from the file) until the I/O completes.
    pub unsafe fn segment_view(
        seg: Arc<Segment>,
        offset: u64,
        len: usize,
        init: bool,
    ) -> io::Result<IoBuffer> {
        let region = seg
            .backend
            .host_region()
            .ok_or_else(|| io::Error::other("not a host-memory segment"))?;
        region.check(offset, len)?;
        let ptr = region.ptr(offset);
        Ok(IoBuffer {
            ptr,
            cap: len,
            init: if init { len } else { 0 },
            _owner: Owner::Segment(seg),
        })
    }

    pub fn len(&self) -> usize {
        self.init
    }

    pub fn is_empty(&self) -> bool {
        self.init == 0
    }

    /// The bytes read (owned buffers).
    pub fn into_vec(self) -> Vec<u8> {
        match self._owner {
            Owner::Vec(mut v) => {
                // SAFETY: `init` bytes were written by the read.
                unsafe { v.set_len(self.init) };
                v
            }
            Owner::Segment(_) => Vec::new(),
        }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `init` bytes from `ptr` are initialized and alive (see the owner).
        unsafe { std::slice::from_raw_parts(self.ptr, self.init) }
    }
}

// SAFETY: ptr/cap/init describe memory owned by the buffer.
unsafe impl monoio::buf::IoBuf for IoBuffer {
    fn read_ptr(&self) -> *const u8 {
        self.ptr
    }

    fn bytes_init(&self) -> usize {
        self.init
    }
}

// SAFETY: as above; `set_init` never exceeds `cap` (monoio guarantees it).
unsafe impl monoio::buf::IoBufMut for IoBuffer {
    fn write_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    fn bytes_total(&mut self) -> usize {
        self.cap
    }

    unsafe fn set_init(&mut self, pos: usize) {
        self.init = pos.min(self.cap);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    Read,
    Write,
}

/// Injected failures, from the environment (tests).
#[derive(Default)]
struct Faults {
    write: Option<(i32, u64)>,
    read: Option<(i32, u64)>,
    writes_seen: AtomicU64,
    reads_seen: AtomicU64,
}

fn parse_fault(var: &str) -> Option<(i32, u64)> {
    let v = std::env::var(var).ok()?;
    let (cause, after) = match v.split_once('@') {
        Some((c, n)) => (c.to_string(), n.parse().unwrap_or(1)),
        None => (v, 1),
    };
    let errno = match cause.to_ascii_lowercase().as_str() {
        "enospc" => libc::ENOSPC,
        "eio" => libc::EIO,
        _ => return None,
    };
    Some((errno, after.max(1)))
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
        IoOp::Write => (f.write, &f.writes_seen),
        IoOp::Read => (f.read, &f.reads_seen),
    };
    let (errno, after) = rule?;
    let n = seen.fetch_add(1, Relaxed) + 1;
    (n >= after).then(|| io::Error::from_raw_os_error(errno))
}

/// One SSD segment's file.
pub struct SsdFile {
    pub path: PathBuf,
    /// The directory, as configured (the `disk_path` label).
    pub dir: String,
    file: std::fs::File,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    /// Bytes read and written per second, for the disk bandwidth gauges.
    pub read_window: RateWindow,
    pub write_window: RateWindow,
    /// 0 normal; else the errno of the last failed operation (cleared by the next success).
    status: AtomicU8,
    logged: Mutex<HashSet<(IoOp, i32)>>,
}

impl SsdFile {
    /// Creates (or empties) the rank's file in `dir`, sized (sparsely) to `capacity`.
    pub fn create(dir: &str, rank: u32, capacity: u64) -> io::Result<SsdFile> {
        std::fs::create_dir_all(dir)?;
        let path = Path::new(dir).join(format!("mmc-rank-{rank}.ssd"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        file.set_len(capacity)?;
        Ok(SsdFile {
            path,
            dir: dir.to_string(),
            file,
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            read_window: RateWindow::new(std::time::Instant::now()),
            write_window: RateWindow::new(std::time::Instant::now()),
            status: AtomicU8::new(0),
            logged: Mutex::new(HashSet::new()),
        })
    }

    pub fn status(&self) -> u8 {
        self.status.load(Relaxed)
    }

    fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn record(&self, op: IoOp, res: &io::Result<()>, bytes: usize) {
        match res {
            Ok(()) => {
                let (c, w) = if op == IoOp::Read {
                    (&self.bytes_read, &self.read_window)
                } else {
                    (&self.bytes_written, &self.write_window)
                };
                c.fetch_add(bytes as u64, Relaxed);
                w.add(bytes as u64);
                self.status.store(0, Relaxed);
            }
            Err(e) => {
                let c = if op == IoOp::Read {
                    &self.read_errors
                } else {
                    &self.write_errors
                };
                c.fetch_add(1, Relaxed);
                let errno = e.raw_os_error().unwrap_or(-1);
                self.status.store(errno.clamp(1, 255) as u8, Relaxed);
                let first = self
                    .logged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((op, errno));
                if first {
                    log::error!(
                        "SSD {} of {} failed: {e} (further {op:?} errors with this cause are counted, not logged)",
                        if op == IoOp::Read { "read" } else { "write" },
                        self.path.display()
                    );
                }
            }
        }
    }
}

/// A shard's access path to SSD files, chosen by its io driver.
pub enum SsdIo {
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
        let file = seg.backend.file().expect("an SSD segment");
        let len = buf.len();
        let (res, buf) = match injected(IoOp::Write) {
            Some(e) => (Err(e), buf),
            None => self.run(seg, IoOp::Write, offset, buf).await,
        };
        file.record(IoOp::Write, &res, len);
        (res, buf)
    }

    /// Fills `buf` (its full capacity) from `offset`.
    pub async fn read(
        &self,
        seg: &Arc<Segment>,
        offset: u64,
        buf: IoBuffer,
    ) -> (io::Result<()>, IoBuffer) {
        let file = seg.backend.file().expect("an SSD segment");
        let len = buf.cap;
        let (res, buf) = match injected(IoOp::Read) {
            Some(e) => (Err(e), buf),
            None => self.run(seg, IoOp::Read, offset, buf).await,
        };
        file.record(IoOp::Read, &res, len);
        (res, buf)
    }

    /// An access path for a shard on the io_uring driver (`uring`) or the epoll driver.
    pub fn new(uring: bool) -> SsdIo {
        if uring {
            SsdIo::Ring(RefCell::new(HashMap::new()))
        } else {
            SsdIo::Pool
        }
    }

    /// Forgets this shard's descriptor of an unmounted segment.
    pub fn forget(&self, seg: SegmentId) {
        if let SsdIo::Ring(files) = self {
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
        match self {
            SsdIo::Ring(files) => {
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
                    IoOp::Write => f.write_all_at(buf, offset).await,
                    IoOp::Read => f.read_exact_at(buf, offset).await,
                }
            }
            SsdIo::Pool => {
                let (tx, rx) = flume::bounded(1);
                let job = Job {
                    fd: file.raw_fd(),
                    op,
                    offset,
                    buf,
                    done: tx,
                };
                if let Err(flume::SendError(job)) = pool().send(job) {
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

struct Job {
    fd: RawFd,
    op: IoOp,
    offset: u64,
    buf: IoBuffer,
    done: flume::Sender<(io::Result<()>, IoBuffer)>,
}

/// Threads that run file I/O for shards on the epoll driver (which has no asynchronous file
/// I/O). Two threads: SSD operations are large and few; more would only contend.
fn pool() -> &'static flume::Sender<Job> {
    static POOL: OnceLock<flume::Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = flume::unbounded::<Job>();
        for i in 0..2 {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("mmc-ssd-io-{i}"))
                .spawn(move || {
                    while let Ok(mut job) = rx.recv() {
                        let res = match job.op {
                            IoOp::Write => pwrite_all(job.fd, job.buf.as_slice(), job.offset),
                            IoOp::Read => {
                                let cap = job.buf.cap;
                                // SAFETY: the buffer owns `cap` writable bytes at `ptr`.
                                let dst =
                                    unsafe { std::slice::from_raw_parts_mut(job.buf.ptr, cap) };
                                let r = pread_exact(job.fd, dst, job.offset);
                                if r.is_ok() {
                                    job.buf.init = cap;
                                }
                                r
                            }
                        };
                        let _ = job.done.send((res, job.buf));
                    }
                })
                .expect("cannot start an SSD I/O thread");
        }
        tx
    })
}

fn pwrite_all(fd: RawFd, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: data is a valid slice; fd stays open while its segment lives.
        let n =
            unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwrite wrote nothing",
            ));
        }
        data = &data[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

fn pread_exact(fd: RawFd, mut dst: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !dst.is_empty() {
        // SAFETY: dst is a valid writable slice.
        let n = unsafe {
            libc::pread(
                fd,
                dst.as_mut_ptr().cast(),
                dst.len(),
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short read from SSD file",
            ));
        }
        let n = n as usize;
        dst = &mut dst[n..];
        offset += n as u64;
    }
    Ok(())
}
