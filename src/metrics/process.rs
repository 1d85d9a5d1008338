//! The standard `process_*` figures (as Prometheus client libraries export them), read from
//! `/proc/self` when scraped: a few small files and one directory listing, whatever is stored.

use std::sync::OnceLock;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Process {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
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
fn stat_fields(stat: &str) -> Vec<&str> {
    // The command name is in parentheses and may itself hold spaces or ')'.
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    rest.split_whitespace().collect()
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
    let f = stat_fields(stat);
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = ticks.max(1) as f64;
    // Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24 (rss), counted from 1.
    Process {
        cpu_seconds: (num(11) + num(12)) as f64 / ticks,
        start_time_seconds: btime as f64 + num(19) as f64 / ticks,
        virtual_bytes: num(20),
        resident_bytes: num(21) * page,
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

/// Reads the figures now. Missing files give zeros (this is a scrape, not a health check).
pub fn read() -> Process {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let mut p = from_stat(
        &stat,
        sysconf(libc::_SC_CLK_TCK),
        sysconf(libc::_SC_PAGESIZE),
        boot_time(),
    );
    p.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
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
    }
}
