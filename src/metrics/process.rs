//! The standard `process_*` figures (as Prometheus client libraries export them), read when
//! scraped, in a few cheap system calls whatever is stored: the CPU time from `times(2)`
//! (the very utime and stime `/proc/self/stat` shows, in clock ticks, without the kernel
//! writing out its 52 fields), the memory from `/proc/self/statm`, the entries of
//! `/proc/self/fd`, the open-files limit. The two files stay open (a `pread` or a rewind
//! reads them afresh, no path lookup); the start time is read once. Listing `/proc/self/fd`
//! costs more than all the rest (8 µs on the reference VM, whatever few descriptors there
//! are), then reading `statm`: the descriptor count, the open-files limit and the memory
//! figures are read again when a second has passed since they were last read, so a scraper
//! that comes back more often than that reads them up to a second old; the CPU time, counted
//! in clock ticks, is read again when a tick (10 ms) has passed.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Process {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    /// Open file descriptors, as a listing of `/proc/self/fd` counts them (the one reading
    /// the directory included, the ones this module keeps open for its files not).
    pub open_fds: u64,
    pub max_fds: u64,
    /// Unix time the process started, seconds.
    pub start_time_seconds: f64,
}

fn sysconf(name: libc::c_int) -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 { v as u64 } else { 0 }
}

/// The fields of `/proc/self/stat` after the command name (field 3, `state`, is index 0).
fn stat_fields(stat: &str) -> impl Iterator<Item = &str> {
    // The command name is in parentheses and may itself hold spaces or ')'.
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    rest.split_ascii_whitespace()
}

/// Boot time (Unix seconds), from `/proc/stat`'s `btime` line; read once.
fn boot_time() -> u64 {
    static BTIME: OnceLock<u64> = OnceLock::new();
    *BTIME.get_or_init(|| {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    })
}

/// Parses `/proc/self/stat`'s text into the CPU, memory and start-time figures.
fn from_stat(stat: &str, ticks: u64, page: u64, btime: u64) -> Process {
    // Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24 (rss), counted from 1.
    let mut f = [0u64; 22];
    for (slot, v) in f.iter_mut().zip(stat_fields(stat)) {
        *slot = v.parse().unwrap_or(0);
    }
    let ticks = ticks.max(1) as f64;
    Process {
        cpu_seconds: (f[11] + f[12]) as f64 / ticks,
        start_time_seconds: btime as f64 + f[19] as f64 / ticks,
        virtual_bytes: f[20],
        resident_bytes: f[21] * page,
        ..Process::default()
    }
}

/// The soft limit on open files.
fn max_fds() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    lim.rlim_cur
}

fn open(path: &std::ffi::CStr, flags: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor returned is owned by the `OwnedFd`.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_RDONLY | libc::O_CLOEXEC) };
    // SAFETY: `fd` was just opened and nothing else owns it.
    (fd >= 0).then(|| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// `/proc/self/statm`, kept open.
static STATM: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// `/proc/self/fd`, kept open once a scrape opened it ([`DIR_KEPT`]).
// LOCK-OK: taken by a scrape only, and never waited for (a busy one is passed by).
static DIR: Mutex<Option<OwnedFd>> = Mutex::new(None);
static DIR_KEPT: AtomicBool = AtomicBool::new(false);

/// Descriptors this module keeps open (which `open_fds` does not count).
fn kept() -> u64 {
    u64::from(STATM.get().is_some_and(Option::is_some)) + u64::from(DIR_KEPT.load(Relaxed))
}

/// (total, resident) pages from `/proc/self/statm`, kept open: each `pread` at 0 reads it
/// afresh. Its first two fields are the `vsize` (in pages) and `rss` fields of
/// `/proc/self/stat`.
fn statm() -> (u64, u64) {
    let Some(fd) = STATM.get_or_init(|| open(c"/proc/self/statm", 0)).as_ref() else {
        return (0, 0);
    };
    let mut buf = [0u8; 128];
    // SAFETY: the descriptor is open for the life of the process; `buf` is writable for its
    // length.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let text = std::str::from_utf8(&buf[..usize::try_from(n).unwrap_or(0)]).unwrap_or("");
    let mut f = text
        .split_ascii_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}

/// User plus system CPU time in clock ticks, all threads: `times(2)`, which reads the same
/// adjusted thread-group times as `/proc/self/stat`'s utime and stime, in the same unit.
fn cpu_ticks() -> u64 {
    // SAFETY: an all-zero `tms` is valid; `times` fills it.
    let mut t: libc::tms = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is writable.
    unsafe { libc::times(&mut t) };
    (t.tms_utime as u64).wrapping_add(t.tms_stime as u64)
}

/// Unix time the process started, from `/proc/self/stat` (read once).
fn start_time(ticks: u64) -> f64 {
    static START: OnceLock<f64> = OnceLock::new();
    *START.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        from_stat(&stat, ticks, 0, boot_time()).start_time_seconds
    })
}

/// Counts the entries of the directory `dir` (rewound first), `.` and `..` left out.
fn count_entries(dir: libc::c_int) -> u64 {
    // SAFETY: `dir` is an open directory.
    if unsafe { libc::lseek(dir, 0, libc::SEEK_SET) } != 0 {
        return 0;
    }
    let mut buf = [0u8; 8192];
    let mut count = 0u64;
    loop {
        // SAFETY: `dir` is an open directory; `buf` is writable for its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0usize;
        while at + 19 < n as usize {
            // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[at + 19..at + reclen];
            if !(name.starts_with(b".\0") || name.starts_with(b"..\0")) {
                count += 1;
            }
            at += reclen;
        }
    }
    count
}

/// The open descriptors, as a fresh listing of `/proc/self/fd` counts them: its own
/// descriptor included, those this module keeps open left out. The directory stays open for
/// the next scrape (a scrape on another shard meanwhile opens its own for the moment).
fn open_fds() -> u64 {
    match DIR.try_lock() {
        Ok(mut dir) => {
            if dir.is_none() {
                *dir = open(c"/proc/self/fd", libc::O_DIRECTORY);
                DIR_KEPT.store(dir.is_some(), Relaxed);
            }
            // The kept directory is the reading one.
            dir.as_ref().map_or(0, |d| {
                (count_entries(d.as_raw_fd()) + 1).saturating_sub(kept())
            })
        }
        // The one opened now is the reading one.
        Err(_) => open(c"/proc/self/fd", libc::O_DIRECTORY)
            .map_or(0, |d| count_entries(d.as_raw_fd()).saturating_sub(kept())),
    }
}

/// How long the figures read by [`recent`] stand.
const FDS_FOR: Duration = Duration::from_secs(1);

/// The figures that cost more to read than the rest and move slowly, read together:
/// [`open_fds`], the open-files limit, and `/proc/self/statm`'s (total, resident) pages.
fn slow_figures() -> [u64; 4] {
    let (total, resident) = statm();
    [open_fds(), max_fds(), total, resident]
}

/// `N` figures read at some time, kept for a while.
struct Kept<const N: usize> {
    /// When the figures were read (µs since some origin, 0: never).
    read_at: AtomicU64,
    figures: [AtomicU64; N],
}

impl<const N: usize> Kept<N> {
    const fn new() -> Kept<N> {
        Kept {
            read_at: AtomicU64::new(0),
            figures: [const { AtomicU64::new(0) }; N],
        }
    }

    /// The kept figures at `now` (µs, above 0), or those `read` reads when they are `max_age`
    /// old (or none were read yet).
    fn at(&self, now: u64, max_age: Duration, read: impl FnOnce() -> [u64; N]) -> [u64; N] {
        let at = self.read_at.load(Relaxed);
        if at != 0 && now - at.min(now) < max_age.as_micros() as u64 {
            return self.figures.each_ref().map(|f| f.load(Relaxed));
        }
        let figures = read();
        for (f, v) in self.figures.iter().zip(figures) {
            f.store(v, Relaxed);
        }
        self.read_at.store(now, Relaxed);
        figures
    }
}

/// Microseconds since the first call, from 1.
fn now_us() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// [`slow_figures`], read again once [`FDS_FOR`] passed since the last reading (any thread).
fn recent() -> [u64; 4] {
    static KEPT: Kept<4> = Kept::new();
    KEPT.at(now_us(), FDS_FOR, slow_figures)
}

/// How long a reading of the CPU time stands: one clock tick, its unit (100 Hz).
const CPU_FOR: Duration = Duration::from_millis(10);

/// [`cpu_ticks`], read again once [`CPU_FOR`] passed since the last reading (any thread):
/// a scraper that comes back more often than a tick reads the time of up to a tick ago.
fn recent_cpu_ticks() -> u64 {
    static KEPT: Kept<1> = Kept::new();
    let [ticks] = KEPT.at(now_us(), CPU_FOR, || [cpu_ticks()]);
    ticks
}

/// Reads the figures now (the descriptor count, its limit and the memory figures up to a
/// second old). What cannot be read is 0 (this is a scrape, not a health check).
pub fn read() -> Process {
    let ticks = sysconf(libc::_SC_CLK_TCK);
    let page = sysconf(libc::_SC_PAGESIZE);
    let [open_fds, max_fds, total, resident] = recent();
    Process {
        cpu_seconds: recent_cpu_ticks() as f64 / ticks.max(1) as f64,
        resident_bytes: resident * page,
        virtual_bytes: total * page,
        open_fds,
        max_fds,
        start_time_seconds: start_time(ticks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_by_position() {
        let stat = "4242 (mmc server) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 6 0 1000 123456789 300 18446744073709551615";
        let p = from_stat(stat, 100, 4096, 1_700_000_000);
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.start_time_seconds, 1_700_000_010.0);
        assert_eq!(p.virtual_bytes, 123_456_789);
        assert_eq!(p.resident_bytes, 300 * 4096);
    }

    /// The slow figures stand for a second, the CPU time for a tick; then a reading shows
    /// what moved.
    #[test]
    fn slow_figures_are_read_again_after_a_second() {
        let kept = Kept::new();
        let second = FDS_FOR.as_micros() as u64;
        assert_eq!(kept.at(5, FDS_FOR, || [1, 2, 3, 4]), [1, 2, 3, 4]);
        assert_eq!(kept.at(5 + second - 1, FDS_FOR, || [9; 4]), [1, 2, 3, 4]);
        assert_eq!(kept.at(5 + second, FDS_FOR, || [9, 8, 7, 6]), [9, 8, 7, 6]);
        assert_eq!(kept.at(6 + second, FDS_FOR, || [0; 4]), [9, 8, 7, 6]);
        // The CPU time, for a tick.
        let cpu = Kept::new();
        assert_eq!(cpu.at(5, CPU_FOR, || [7]), [7]);
        assert_eq!(cpu.at(5 + 9_999, CPU_FOR, || [8]), [7]);
        assert_eq!(cpu.at(5 + 10_000, CPU_FOR, || [8]), [8]);
    }

    #[test]
    fn this_process_has_figures() {
        let p = read();
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(p.start_time_seconds > 1e9 && p.start_time_seconds <= now + 1.0);
        // The count a fresh reading gives is the directory listing's (not `p`'s, up to a
        // second old; other tests open and close descriptors meanwhile, so a few tries until
        // two readings taken together agree).
        let mut last = (0, 0);
        let agrees = (0..200).any(|_| {
            let listed = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
            last = (open_fds(), listed);
            last.0.abs_diff(last.1) <= 2
        });
        assert!(agrees, "{} vs {}", last.0, last.1);
        let fresh = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f = from_stat(&fresh, sysconf(libc::_SC_CLK_TCK), 4096, boot_time());
        assert_eq!(f.start_time_seconds, p.start_time_seconds);
        assert!(f.cpu_seconds >= p.cpu_seconds);
    }
}
