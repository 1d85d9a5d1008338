//! Building one monoio runtime per shard thread: io driver choice with fallbacks, and pinning.
//!
//! The io_uring driver is set up with `COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN`
//! (measured on this kind of machine: 30-40% slower than epoll without them, ~6% less CPU than
//! epoll with them). The chain is: io_uring with those flags → plain io_uring → epoll, each
//! step logged. A ring that cannot be allocated (small `RLIMIT_MEMLOCK` on old kernels) is
//! retried at half the size down to 256 entries before the driver is given up.

use std::future::Future;
use std::io;

use monoio::time::TimeDriver;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

/// What the operator asked for with `--io-driver`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring if the kernel allows it, with the plain-TCP front on a ring of its own
    /// (`http::front_ring`) when the kernel has multishot receive and buffer rings; else
    /// epoll.
    Auto,
    /// monoio's io_uring driver for everything (no front ring), or fail.
    Uring,
    /// epoll only.
    Epoll,
    /// io_uring or fail, with the plain-TCP front on a ring of its own (`http::front_ring`)
    /// when the kernel has multishot receive and buffer rings (as `Auto`, without the epoll
    /// fallback).
    Ring,
}

impl DriverChoice {
    pub fn parse(s: &str) -> Result<DriverChoice, &'static str> {
        match s {
            "auto" => Ok(DriverChoice::Auto),
            "uring" | "io_uring" | "iouring" => Ok(DriverChoice::Uring),
            "epoll" | "legacy" => Ok(DriverChoice::Epoll),
            "ring" | "front_ring" => Ok(DriverChoice::Ring),
            _ => Err("one of auto, uring, epoll, ring"),
        }
    }
}

/// The driver a shard actually runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring with COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN.
    UringTuned {
        entries: u32,
    },
    /// io_uring without the setup flags (kernels older than 6.1).
    UringPlain {
        entries: u32,
    },
    Epoll,
    /// `UringTuned` or `UringPlain` under the HTTP front's own ring (`--io-driver ring`).
    FrontRing {
        entries: u32,
        tuned: bool,
    },
}

impl DriverKind {
    /// The same runtime with the front ring over it.
    pub fn with_front_ring(self) -> DriverKind {
        match self {
            DriverKind::UringTuned { entries } => DriverKind::FrontRing {
                entries,
                tuned: true,
            },
            DriverKind::UringPlain { entries } => DriverKind::FrontRing {
                entries,
                tuned: false,
            },
            k => k,
        }
    }

    /// A short name: `io_uring`, `io_uring (plain)` or `epoll`.
    pub fn name(&self) -> &'static str {
        match self {
            DriverKind::UringTuned { .. } => "io_uring",
            DriverKind::UringPlain { .. } => "io_uring (plain)",
            DriverKind::Epoll => "epoll",
            DriverKind::FrontRing { .. } => "io_uring + front ring",
        }
    }
}

impl std::fmt::Display for DriverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverKind::UringTuned { entries } => {
                write!(
                    f,
                    "io_uring (coop_taskrun+single_issuer+defer_taskrun, {entries} entries)"
                )
            }
            DriverKind::UringPlain { entries } => write!(f, "io_uring (plain, {entries} entries)"),
            DriverKind::Epoll => f.write_str("epoll"),
            DriverKind::FrontRing { entries, tuned } => {
                let flags = if *tuned {
                    "coop_taskrun+single_issuer+defer_taskrun"
                } else {
                    "plain"
                };
                write!(f, "io_uring ({flags}, {entries} entries) + front ring")
            }
        }
    }
}

/// Test hook: `MMC_FAULT_URING=flags` makes the tuned setup fail as on an old kernel,
/// `MMC_FAULT_URING=all` makes every io_uring setup fail as under a seccomp filter. It lets the
/// tests prove the fallback chain on a kernel where io_uring works.
fn injected_fault(tuned: bool) -> Option<io::Error> {
    match std::env::var("MMC_FAULT_URING").ok().as_deref() {
        Some("all") => Some(io::Error::from_raw_os_error(libc::EPERM)),
        Some("flags") if tuned => Some(io::Error::from_raw_os_error(libc::EINVAL)),
        _ => None,
    }
}

type UringRuntime = monoio::Runtime<TimeDriver<IoUringDriver>>;
type EpollRuntime = monoio::Runtime<TimeDriver<LegacyDriver>>;

fn build_uring(entries: u32, tuned: bool) -> io::Result<UringRuntime> {
    if let Some(e) = injected_fault(tuned) {
        return Err(e);
    }
    let mut urb = io_uring::IoUring::builder();
    if tuned {
        urb.setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun();
    }
    RuntimeBuilder::<IoUringDriver>::new()
        .with_entries(entries)
        .uring_builder(urb)
        .enable_timer()
        .build()
}

/// Why io_uring was given up, for the log line.
fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            format!("{e} (io_uring blocked, e.g. by a seccomp profile or kernel.io_uring_disabled)")
        }
        Some(libc::ENOSYS) => format!("{e} (kernel without io_uring)"),
        Some(libc::ENOMEM) => format!("{e} (ring memory; raise RLIMIT_MEMLOCK)"),
        _ => e.to_string(),
    }
}

enum Built {
    Uring(UringRuntime, DriverKind),
    Epoll(EpollRuntime),
}

fn build(choice: DriverChoice, ring_entries: u32, shard: usize) -> Result<Built, String> {
    let mut last_err = None;
    if choice != DriverChoice::Epoll {
        let mut entries = ring_entries.next_power_of_two().clamp(256, 32768);
        let mut tuned = true;
        loop {
            match build_uring(entries, tuned) {
                Ok(rt) => {
                    let kind = if tuned {
                        DriverKind::UringTuned { entries }
                    } else {
                        DriverKind::UringPlain { entries }
                    };
                    return Ok(Built::Uring(rt, kind));
                }
                Err(e) if tuned && e.raw_os_error() == Some(libc::EINVAL) => {
                    log::warn!(
                        "shard {shard}: io_uring setup flags refused ({e}); using plain io_uring"
                    );
                    tuned = false;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && entries > 256 => {
                    log::warn!(
                        "shard {shard}: io_uring ring of {entries} entries refused ({}); trying {}",
                        describe(&e),
                        entries / 2
                    );
                    entries /= 2;
                }
                Err(e) => {
                    last_err = Some(describe(&e));
                    break;
                }
            }
        }
    }
    match (choice, last_err) {
        (DriverChoice::Uring | DriverChoice::Ring, Some(e)) => {
            let name = if choice == DriverChoice::Ring {
                "ring"
            } else {
                "uring"
            };
            Err(format!("--io-driver {name}: io_uring is unavailable: {e}"))
        }
        (_, e) => {
            if let Some(e) = e {
                log::warn!("shard {shard}: io_uring unavailable: {e}; falling back to epoll");
            }
            let rt = RuntimeBuilder::<LegacyDriver>::new()
                .enable_timer()
                .build()
                .map_err(|e| format!("cannot create the epoll driver: {e}"))?;
            Ok(Built::Epoll(rt))
        }
    }
}

thread_local! {
    static ON_IO_URING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is a shard on an io_uring driver: every operation there completes
/// through the ring, so a task that awaits one lets the shard's other tasks run first (the
/// epoll driver completes a ready operation at once, without yielding).
pub fn on_io_uring() -> bool {
    ON_IO_URING.get()
}

/// Builds this thread's runtime and runs `make(kind)` on it to completion. Logs the driver
/// once. Returns an error (never panics) when the requested driver cannot be built.
pub fn run_shard<F, M>(
    choice: DriverChoice,
    ring_entries: u32,
    shard: usize,
    make: M,
) -> Result<F::Output, String>
where
    M: FnOnce(DriverKind) -> F,
    F: Future,
{
    match build(choice, ring_entries, shard)? {
        Built::Uring(mut rt, kind) => {
            log::info!("shard {shard}: io driver {kind}");
            ON_IO_URING.set(true);
            Ok(rt.block_on(make(kind)))
        }
        Built::Epoll(mut rt) => {
            log::info!("shard {shard}: io driver {}", DriverKind::Epoll);
            Ok(rt.block_on(make(DriverKind::Epoll)))
        }
    }
}

/// The CPUs this process may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            return (0..n).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The process's CPUs: its main thread's affinity mask, which `taskset` sets and the shards
/// are chosen from (a thread a shard starts inherits the shard's one CPU instead). `None` when
/// it cannot be read.
pub fn process_cpu_set() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for the main thread (its id
    // is the process id) and keeps no pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        (libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0).then_some(set)
    }
}

use crate::common::affinity::pin_to_cpus;
pub use crate::common::affinity::run_on;

/// Pins the calling thread to one CPU (`EINVAL` past `CPU_SETSIZE`).
pub fn pin_to(cpu: usize) -> io::Result<()> {
    pin_to_cpus(&[cpu])
}

/// Formats a CPU list compactly (`0-3,8`), for log lines and error messages.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_format_compactly() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8]), "0-3,8");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[0, 2, 3]), "0,2-3");
    }

    #[test]
    fn driver_names() {
        assert_eq!(DriverChoice::parse("epoll"), Ok(DriverChoice::Epoll));
        assert_eq!(DriverChoice::parse("ring"), Ok(DriverChoice::Ring));
        assert!(DriverChoice::parse("kqueue").is_err());
    }
}
