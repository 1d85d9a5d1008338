//! The standard `process_*` figures (as Prometheus client libraries export them), read when
//! scraped: `/proc/self/stat` (CPU time, memory, start time) through a descriptor kept open
//! for it (one `pread` a scrape, no path lookup), the entries of `/proc/self/fd`, and the
//! open-files limit. Whatever is stored, a few system calls.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Process {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    /// Open file descriptors (with the one kept on `/proc/self/stat`).
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

/// `/proc/self/stat`, opened once: each `pread` at 0 reads it afresh.
fn stat_file() -> Option<&'static OwnedFd> {
    static STAT: OnceLock<Option<OwnedFd>> = OnceLock::new();
    STAT.get_or_init(|| {
        std::fs::File::open("/proc/self/stat")
            .ok()
            .map(OwnedFd::from)
    })
    .as_ref()
}

/// Reads `/proc/self/stat` into `buf` (empty when it cannot be read).
fn read_stat(buf: &mut [u8; 1024]) -> &str {
    let Some(fd) = stat_file() else {
        return "";
    };
    // SAFETY: the descriptor is open for the life of the process; `buf` is writable for
    // its length.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).unwrap_or(0);
    std::str::from_utf8(&buf[..n]).unwrap_or("")
}

/// The entries of `/proc/self/fd` (the descriptor reading it among them), read with
/// `getdents64` into a buffer on the stack.
fn open_fds() -> u64 {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let dir = unsafe {
        libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
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
    // SAFETY: `dir` was opened above and is closed once.
    unsafe { libc::close(dir) };
    count
}

/// Reads the figures now. What cannot be read is 0 (this is a scrape, not a health check).
pub fn read() -> Process {
    let mut buf = [0u8; 1024];
    let stat = read_stat(&mut buf);
    let mut p = from_stat(
        stat,
        sysconf(libc::_SC_CLK_TCK),
        sysconf(libc::_SC_PAGESIZE),
        boot_time(),
    );
    p.open_fds = open_fds();
    p.max_fds = max_fds();
    p
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
        // The same figures the directory listing and a fresh read of the file give.
        let listed = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        assert!(
            p.open_fds.abs_diff(listed) <= 2,
            "{} vs {listed}",
            p.open_fds
        );
        let fresh = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f = from_stat(&fresh, sysconf(libc::_SC_CLK_TCK), 4096, boot_time());
        assert_eq!(f.start_time_seconds, p.start_time_seconds);
        assert!(f.cpu_seconds >= p.cpu_seconds);
    }
}
