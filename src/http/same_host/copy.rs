//! The copies of the same-host data path (`super`): one `process_vm_readv`/`writev` between
//! this process and a peer's memory, and a large copy made in two halves at once, the first on
//! the shard thread's copy helper (`mmc-copy-N`), the second on the shard.

use std::io;

pub(super) use crate::common::copy::memcpy;

/// Copies at least this many bytes in two halves on two threads (below it, the hand-over
/// costs more than it saves). Measured side by side on the reference VM, one client thread
/// (perf/RESULTS.md, *Same-host data path*, session 6): a whole copy was faster at 256 KiB
/// (158 against 228 µs per get), the same at 512 KiB, and halves faster from 1 MiB up (389
/// against 515 µs; 4 MiB: 524 against 740).
pub(super) const SPLIT_MIN_BYTES: usize = 512 * 1024;

/// The same for a `memcpy` through a buffer the client shares (`super::shared`), which runs
/// three to four times as fast as the kernel's copy: side by side (perf/RESULTS.md, *Session
/// 9*), halves made 4 MiB gets 505 → 377 µs and puts 415 → 338, and 1 MiB ones no faster
/// (152 against 144 µs, puts 169 against 187).
pub(super) const SHARED_SPLIT_MIN_BYTES: usize = 2 << 20;

/// One `process_vm_readv` (`out`: `process_vm_writev`) of `len` bytes between `local` and the
/// peer `pid`'s `remote`: all of them or an error.
///
/// # Safety
/// As [`super::LocalPeer::read`] and [`super::LocalPeer::write`].
pub(super) unsafe fn vm_copy(
    pid: libc::pid_t,
    remote: &[libc::iovec],
    local: *mut u8,
    len: usize,
    out: bool,
) -> io::Result<()> {
    let l = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    // SAFETY: `l` is valid per the caller's contract; `remote` names the peer's memory, which
    // the kernel checks (a bad address fails the call, or shortens it).
    let n = unsafe {
        if out {
            libc::process_vm_writev(pid, &l, 1, remote.as_ptr(), remote.len() as _, 0)
        } else {
            libc::process_vm_readv(pid, &l, 1, remote.as_ptr(), remote.len() as _, 0)
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != len {
        // Part of the range was not the peer's memory (or it exited meanwhile).
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// A copy of `len` bytes (at least [`SPLIT_MIN_BYTES`]) in two halves at once: the first on
/// this shard's copy helper, the second here (one core copies at about half of memmove's speed
/// through the kernel; the client's thread waits meanwhile, so another core is usually free).
/// Returns the copy's result, and whether this thread took the first half back (the helper
/// had not started it, or there is none).
///
/// # Safety
/// As [`vm_copy`].
pub(super) unsafe fn in_halves(
    pid: libc::pid_t,
    remote: &[libc::iovec],
    local: *mut u8,
    len: usize,
    out: bool,
) -> (io::Result<()>, bool) {
    let half = len / 2;
    let first = What::Vm {
        pid,
        remote: super::sub_iov(remote, 0, half),
        local: local as usize,
        out,
    };
    // SAFETY (each closure): forwarded contract, for its half.
    let second = || unsafe {
        vm_copy(
            pid,
            &super::sub_iov(remote, half, len - half),
            local.add(half),
            len - half,
            out,
        )
    };
    let first_here = || unsafe { vm_copy(pid, &super::sub_iov(remote, 0, half), local, half, out) };
    // SAFETY: `first` names the caller's memory, valid until this returns.
    unsafe { split(first, half, second, first_here) }
}

/// A `memcpy` of `len` bytes (at least [`SHARED_SPLIT_MIN_BYTES`]) in two halves at once, the first
/// on this shard's copy helper, as [`in_halves`] (for a buffer the client shares: `dst` or
/// `src` is its mapping). Returns whether this thread took the first half back.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes during the call; they do not
/// overlap.
pub(super) unsafe fn memcpy_in_halves(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    stream: bool,
) -> bool {
    let half = len / 2;
    let first = What::Mem {
        dst: dst as usize,
        src: src as usize,
        stream,
    };
    // SAFETY (each closure): the caller's ranges, its half. A memcpy cannot fail.
    let second = || {
        unsafe { memcpy(dst.add(half), src.add(half), len - half, stream) };
        Ok(())
    };
    let first_here = || {
        unsafe { memcpy(dst, src, half, stream) };
        Ok(())
    };
    // SAFETY: `first` names the caller's ranges, valid until this returns.
    unsafe { split(first, half, second, first_here) }.1
}

/// The hand-over both split copies make: `first` (the first `half` bytes) goes to this shard's
/// copy helper, `second` runs here, then `first_here` (the same first half) runs here too when
/// the helper had not started it (on a busy machine it may wait for a core) or there is none;
/// otherwise the helper's half is waited for, whatever happened here: it touches memory the
/// caller owns only until this returns. The copy's result, and whether the first half was
/// taken back.
///
/// # Safety
/// The addresses `first` names are valid for its `half` bytes until this returns.
unsafe fn split(
    first: What,
    half: usize,
    second: impl FnOnce() -> io::Result<()>,
    first_here: impl FnOnce() -> io::Result<()>,
) -> (io::Result<()>, bool) {
    let job = Job {
        what: first,
        len: half,
        done: Done::new(),
    };
    let done = job.done.clone();
    let handed = HELPER.with(|h| h.send(job));
    let mine = second();
    let (theirs, taken_back) = match handed {
        Ok(()) if !done.take_back() => (done.wait(), false),
        _ => (first_here(), true),
    };
    (mine.and(theirs), taken_back)
}

/// Half of a large copy, for a shard's copy helper.
struct Job {
    what: What,
    len: usize,
    done: std::sync::Arc<Done>,
}

/// A job's copy (addresses as integers: the job crosses threads; the shard waits for it).
enum What {
    /// `process_vm_*` between `local` and the peer `pid`'s `remote`.
    Vm {
        pid: libc::pid_t,
        remote: Vec<libc::iovec>,
        local: usize,
        out: bool,
    },
    /// `memcpy` from `src` to `dst` (with non-temporal stores when `stream`).
    Mem {
        dst: usize,
        src: usize,
        stream: bool,
    },
}

impl Job {
    /// # Safety
    /// The addresses are valid for `len` bytes until `done` says the job is over.
    unsafe fn run(&self) -> io::Result<()> {
        match &self.what {
            // SAFETY: per this function's contract.
            What::Vm {
                pid,
                remote,
                local,
                out,
            } => unsafe { vm_copy(*pid, remote, *local as *mut u8, self.len, *out) },
            What::Mem { dst, src, stream } => {
                // SAFETY: per this function's contract; the ranges do not overlap.
                unsafe { memcpy(*dst as *mut u8, *src as *const u8, self.len, *stream) };
                Ok(())
            }
        }
    }
}

// SAFETY: the iovecs name the peer's memory (only the kernel reads them) and the local
// addresses are ones the sending shard keeps valid until `done` says the job is over.
unsafe impl Send for Job {}

/// A job's states: handed over, started by the helper (or taken back by the shard: the
/// helper then skips it), finished.
const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const OK: u8 = 2;
const FAILED: u8 = 3;

/// A job's end, and the shard thread waiting for it.
struct Done {
    state: std::sync::atomic::AtomicU8,
    waiter: std::thread::Thread,
}

impl Done {
    fn new() -> std::sync::Arc<Done> {
        std::sync::Arc::new(Done {
            state: std::sync::atomic::AtomicU8::new(QUEUED),
            waiter: std::thread::current(),
        })
    }

    /// The helper starts the job; false when the shard took it back.
    fn start(&self) -> bool {
        use std::sync::atomic::Ordering::AcqRel;
        self.state
            .compare_exchange(
                QUEUED,
                STARTED,
                AcqRel,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The shard takes the job back; false when the helper started it.
    fn take_back(&self) -> bool {
        use std::sync::atomic::Ordering::AcqRel;
        self.state
            .compare_exchange(QUEUED, OK, AcqRel, std::sync::atomic::Ordering::Relaxed)
            .is_ok()
    }

    fn finish(&self, ok: bool) {
        use std::sync::atomic::Ordering::Release;
        self.state.store(if ok { OK } else { FAILED }, Release);
        self.waiter.unpark();
    }

    /// Waits for the helper's half: first by spinning (for up to `SPIN_BEFORE_PARK`; the
    /// shard thread is blocked in the copy either way, and a parked thread's CPU may halt,
    /// which on a VM costs far more to wake from than the half usually takes to finish), then
    /// parked.
    fn wait(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering::Acquire;
        let spin_until = std::time::Instant::now() + SPIN_BEFORE_PARK;
        let mut spins = 0u32;
        loop {
            match self.state.load(Acquire) {
                OK => return Ok(()),
                FAILED => return Err(io::Error::from_raw_os_error(libc::EFAULT)),
                // The clock read once per 64 spins.
                _ if spins % 64 != 0 || std::time::Instant::now() < spin_until => {
                    spins = spins.wrapping_add(1);
                    std::hint::spin_loop();
                }
                _ => std::thread::park(),
            }
            // (A park may end without an unpark: the state is read again.)
        }
    }
}

/// How long a shard spins for its helper's half before it parks (`Done::wait`).
const SPIN_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(200);

/// A shard thread's copy helper: a thread that takes the first half of its large copies,
/// started at its first one, ending with the shard thread (its channel closes).
struct Helper {
    tx: Option<std::sync::mpsc::Sender<Job>>,
}

impl Helper {
    /// Hands `job` over; gives it back when there is no helper thread.
    fn send(&self, job: Job) -> Result<(), Job> {
        match &self.tx {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    fn start() -> Helper {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        // `mmc-copy-N` beside `mmc-shard-N` (thread names are cut at 15 bytes).
        let shard = std::thread::current();
        let shard = shard.name().unwrap_or("shard");
        let name = format!(
            "mmc-copy-{}",
            shard.strip_prefix("mmc-shard-").unwrap_or(shard)
        );
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            beside_the_shard();
            while let Ok(job) = rx.recv() {
                if !job.done.start() {
                    continue;
                }
                // SAFETY: the sender keeps its addresses valid for `len` bytes until `done`.
                let r = unsafe { job.run() };
                job.done.finish(r.is_ok());
            }
        });
        Helper {
            tx: spawned.ok().map(|_| tx),
        }
    }
}

thread_local! {
    static HELPER: Helper = Helper::start();
}

/// Moves the calling copy helper off its shard's CPU: it inherits the shard's pinning, and
/// on the shard's CPU its half could only start once the shard waits, so the copy was never
/// in two halves at once. It goes to the process's other CPUs (its main thread's mask, which
/// `taskset` sets and shards are chosen from); it stays when there are none.
fn beside_the_shard() {
    let shard = crate::shards::runtime::allowed_cpus();
    let Some(mut set) = crate::shards::runtime::process_cpu_set() else {
        return;
    };
    // SAFETY: every CPU changed is below CPU_SETSIZE (filtered); CPU_CLR and CPU_COUNT only
    // touch the set.
    let left = unsafe {
        for &c in shard.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_CLR(c, &mut set);
        }
        libc::CPU_COUNT(&set)
    };
    if left > 0
        && let Err(e) = crate::shards::runtime::run_on(&set)
    {
        log::debug!("copy helper: cannot leave its shard's CPU: {e}");
    }
}
