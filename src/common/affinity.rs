//! Which CPUs a thread runs on: the one `sched_setaffinity` of the crate, for the shards
//! (one CPU each), the threads that follow the process's mask (copy helpers, movers) and
//! those that run on a NUMA node's CPUs (prefault, movers of a node).

use std::io;

/// Lets the calling thread run on the CPUs of `set`.
pub fn run_on(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads the set and keeps no pointer.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread to `cpus` (one for a shard; a NUMA node's for a thread that commits
/// or copies memory there); `EINVAL` for none, or one past `CPU_SETSIZE`.
pub fn pin_to_cpus(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; every CPU set is below CPU_SETSIZE
    // (checked above).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        set
    };
    run_on(&set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_a_thread_to_the_cpus_it_is_given() {
        // A CPU this process may run on: the one it runs on now.
        // SAFETY: no arguments.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(cpu >= 0);
        let t = std::thread::spawn(move || {
            pin_to_cpus(&[cpu as usize]).unwrap();
            // SAFETY: no arguments.
            unsafe { libc::sched_getcpu() }
        });
        assert_eq!(t.join().unwrap(), cpu);
        assert!(pin_to_cpus(&[]).is_err());
        assert!(pin_to_cpus(&[1 << 20]).is_err());
    }
}
