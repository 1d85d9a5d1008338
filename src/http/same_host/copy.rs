//! The copies of the same-host data path (`super`): one `process_vm_readv`/`writev` between
//! this process and a peer's memory, and a large copy made in two halves at once, the first on
//! the shard thread's copy helper (`mmc-copy-N`), the second on the shard.

use std::io;

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

/// A `memcpy` of `len` bytes; with `stream`, past [`STREAM_MIN_BYTES`], its stores bypass the
/// cache (non-temporal): for a put's bytes going into a blob, which nobody reads soon. A
/// normal copy into memory out of cache reads every line before writing it; 1 MiB into cold
/// memory took 57-61 µs so, 31-39 µs streamed (C, this EPYC VM: `perf/RESULTS.md`, *Session 9*).
/// A copy whose ends are [`aliased`] (up to [`rep_movsb_max`]) takes the same loop with normal
/// stores.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes; they do not overlap.
pub(super) unsafe fn memcpy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    match route(dst, src, len, stream) {
        // SAFETY: per this function's contract.
        #[cfg(target_arch = "x86_64")]
        Route::Sse2 { stream } => unsafe { sse2_copy(dst, src, len, stream) },
        // SAFETY: per this function's contract.
        _ => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
    }
}

/// How [`memcpy`] copies.
#[derive(Debug, PartialEq)]
enum Route {
    /// `std::ptr::copy_nonoverlapping`: the C library's `memcpy`.
    Plain,
    /// [`sse2_copy`]: x86_64 only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Sse2 { stream: bool },
}

fn route(dst: *const u8, src: *const u8, len: usize, stream: bool) -> Route {
    let streamed = stream && len >= STREAM_MIN_BYTES;
    let aliased = (ALIASED_MIN_BYTES..rep_movsb_max()).contains(&len) && aliased(dst, src);
    if cfg!(target_arch = "x86_64") && (streamed || aliased) {
        Route::Sse2 { stream: streamed }
    } else {
        Route::Plain
    }
}

/// Whether `rep movsb` copies from `src` to `dst` at a fraction of its speed: glibc's `memcpy`
/// uses it from 2112 bytes up to [`rep_movsb_max`] on CPUs with ERMS, and on AMD Zen 3 (this
/// project's reference machine) it runs some 20 times slower (1.8 GB/s against 30 in cache,
/// measured in C: `perf/results/copy-alias-17.txt`) when the destination is 1 to 31 bytes past
/// the source modulo 4096. A blob starts on a page and a buffer glibc's `malloc` maps starts 16
/// bytes into one: a get into such a buffer (an array of numpy's) is that case.
fn aliased(dst: *const u8, src: *const u8) -> bool {
    let rel = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..32).contains(&rel)
}

/// The smallest copy [`aliased`] keeps from `rep movsb` (glibc copies smaller ones with vector
/// moves).
const ALIASED_MIN_BYTES: usize = 2048;

/// Where glibc's `memcpy` stops using `rep movsb` on AMD CPUs: the L2 cache's size (larger
/// copies take its AVX loop, faster than [`sse2_copy`] from memory out of cache: 79 against
/// 93 µs per MiB here); 512 KiB (Zen 3's) when the C library does not say.
fn rep_movsb_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        #[cfg(target_env = "gnu")]
        // SAFETY: sysconf reads a value; no memory is passed.
        let l2 = unsafe { libc::sysconf(libc::_SC_LEVEL2_CACHE_SIZE) };
        #[cfg(not(target_env = "gnu"))]
        let l2 = 0;
        usize::try_from(l2)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(512 << 10)
    })
}

/// A copy with SSE2 moves, 64 bytes per step, non-temporal stores when `stream`.
///
/// # Safety
/// As [`memcpy`].
#[cfg(target_arch = "x86_64")]
unsafe fn sse2_copy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_sfence, _mm_store_si128, _mm_stream_si128,
    };
    // SAFETY: the caller's ranges, walked in order: the bytes before `dst`'s first 16-byte
    // boundary copied plainly, then 64 bytes per step (unaligned loads, aligned stores: SSE2,
    // which every x86_64 has), then the tail plainly (under 64 bytes: no `rep movsb`); the
    // fence orders streamed stores before whatever follows (the commit that makes the blob
    // readable).
    unsafe {
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut left) = (dst.add(head), src.add(head), len - head);
        while left >= 64 {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            if stream {
                _mm_stream_si128(d.cast::<__m128i>(), a);
                _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
                _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
                _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            } else {
                _mm_store_si128(d.cast::<__m128i>(), a);
                _mm_store_si128(d.add(16).cast::<__m128i>(), b);
                _mm_store_si128(d.add(32).cast::<__m128i>(), c);
                _mm_store_si128(d.add(48).cast::<__m128i>(), e);
            }
            d = d.add(64);
            s = s.add(64);
            left -= 64;
        }
        std::ptr::copy_nonoverlapping(s, d, left);
        if stream {
            _mm_sfence();
        }
    }
}

/// The smallest copy [`memcpy`] streams (smaller ones are likely to stay in cache anyway).
pub(super) const STREAM_MIN_BYTES: usize = 64 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_whose_ends_are_1_to_31_bytes_apart_modulo_a_page_is_kept_from_rep_movsb() {
        let page = 4096usize;
        let at = |rel: usize| aliased((page * 3 + rel) as *const u8, (page + 5) as *const u8);
        assert!(!aliased(page as *const u8, page as *const u8));
        assert!(!at(5) && !at(5 + 32) && !at(4));
        assert!(at(6) && at(5 + 16) && at(5 + 31));
        // The other way round: the destination before the source is not the slow case.
        assert!(!aliased((page - 16) as *const u8, page as *const u8));
        assert!(aliased((2 * page + 16) as *const u8, page as *const u8));
        // Those copies, and streamed ones, take the SSE2 loop; the rest glibc's `memcpy`.
        if cfg!(target_arch = "x86_64") {
            let (d, s) = ((page * 3 + 16) as *const u8, page as *const u8);
            let n = ALIASED_MIN_BYTES;
            assert_eq!(route(d, s, n, false), Route::Sse2 { stream: false });
            assert_eq!(route(d, s, n - 1, false), Route::Plain);
            let max = rep_movsb_max();
            assert_eq!(route(d, s, max - 1, false), Route::Sse2 { stream: false });
            assert_eq!(route(d, s, max, false), Route::Plain);
            assert_eq!(route(d, s, max, true), Route::Sse2 { stream: true });
            assert_eq!(route(s, s, n, false), Route::Plain);
            assert_eq!(
                route(s, s, STREAM_MIN_BYTES, true),
                Route::Sse2 { stream: true }
            );
            assert_eq!(
                route(d, s, STREAM_MIN_BYTES - 1, true),
                Route::Sse2 { stream: false }
            );
            assert_eq!(route(s, s, STREAM_MIN_BYTES - 1, true), Route::Plain);
        }
        // Copies in and around the window: every byte, nothing around them.
        let mut area = vec![0u8; 48 * page];
        let base = area.as_ptr().align_offset(page);
        let (src_at, dst_at) = (base + 7, base + 20 * page + 7);
        for (i, b) in area[src_at..src_at + 75_000].iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        for rel in [0, 1, 15, 16, 31, 32, 4095] {
            for len in [
                ALIASED_MIN_BYTES - 1,
                ALIASED_MIN_BYTES,
                ALIASED_MIN_BYTES + 77,
                70_000,
            ] {
                let d = dst_at + rel;
                area[d - 64..d + len + 64].fill(0xee);
                let p = area.as_mut_ptr();
                // SAFETY: both ranges lie in `area`, apart.
                unsafe { memcpy(p.add(d), p.add(src_at), len, false) };
                assert!(
                    area[d..d + len] == area[src_at..src_at + len],
                    "{rel} {len}"
                );
                assert!(area[d - 64..d].iter().all(|&b| b == 0xee));
                assert!(area[d + len..d + len + 64].iter().all(|&b| b == 0xee));
            }
        }
    }

    #[test]
    fn a_streamed_copy_is_a_copy_at_every_alignment_and_length() {
        let n = STREAM_MIN_BYTES + 4096;
        let src: Vec<u8> = (0..n + 64).map(|i| (i * 31 % 253) as u8).collect();
        for len in [
            0,
            1,
            63,
            STREAM_MIN_BYTES - 1,
            STREAM_MIN_BYTES,
            STREAM_MIN_BYTES + 77,
            n,
        ] {
            for (d_off, s_off) in [(0, 0), (1, 0), (0, 3), (15, 7), (16, 1), (33, 60)] {
                for stream in [false, true] {
                    let mut dst = vec![0xeeu8; n + 128];
                    // SAFETY: both vectors hold the ranges (offsets below 64, lengths up to n).
                    unsafe {
                        memcpy(
                            dst.as_mut_ptr().add(d_off),
                            src.as_ptr().add(s_off),
                            len,
                            stream,
                        )
                    };
                    assert!(dst[d_off..d_off + len] == src[s_off..s_off + len]);
                    // Nothing written around it.
                    assert!(dst[..d_off].iter().all(|&b| b == 0xee));
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }
}
