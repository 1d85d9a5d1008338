//! Whether a front ring wakes its pump: the pump parks on monoio's ring reading the eventfd
//! registered with the front ring, so a completion that does not signal that eventfd at once
//! is seen only when something else wakes the shard (a timer, another connection), and every
//! request waits for it. A `DEFER_TASKRUN` ring signals its eventfd from the waker's context
//! when a completion is queued for it; on some kernels (seen: 6.18.44-fc-v1252) a wake from a
//! softirq, which is how a peer's bytes arrive over loopback TCP, defers that signal to an
//! RCU callback, 12-24 ms later: each keep-alive request then took as long (0.2 ms with
//! `COOP_TASKRUN`). So each setup is tried with the real thing before it is used: a receive on
//! a loopback TCP connection, armed on the ring, made ready by a write from another thread,
//! and the eventfd must be readable by the time that write has returned (`DEFER_TASKRUN`: the
//! signal is in the write's softirq) or this thread's next system call has (task work
//! otherwise). A deferred signal takes milliseconds, so it fails the probe.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{IoUring, opcode, types};

/// The probe's `user_data` (the front ring's own kinds are small numbers in the high half).
const PROBE: u64 = u64::MAX;

/// Attempts before a setup is given up: a loaded machine may leave one write's softirq to
/// `ksoftirqd`, which signals late even on a kernel that signals at once.
const ATTEMPTS: usize = 3;

/// Whether `efd` (an eventfd) is readable now, and drains it.
fn readable(efd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: efd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, ours; no wait.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    r == 1 && pfd.revents & libc::POLLIN != 0
}

fn drain(efd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes from a non-blocking eventfd into a u64.
    unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) };
}

/// Whether a completion on `ring` signals `efd` (registered with the ring, non-blocking) at
/// once, without the ring being entered. Leaves the ring and the eventfd as they were (the
/// probe's completions reaped, the signals drained). `Err`: the probe itself could not run.
pub fn signals_eventfd(ring: &mut IoUring, efd: RawFd) -> io::Result<bool> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut client = std::net::TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    // The receive's buffer lives on the heap until its last completion has been reaped; on an
    // early return it is leaked (one byte) rather than freed under a receive in flight.
    let buf: *mut [u8; 1] = Box::into_raw(Box::new([0u8; 1]));
    for _ in 0..ATTEMPTS {
        let entry = opcode::Recv::new(types::Fd(server.as_raw_fd()), buf.cast(), 1)
            .build()
            .user_data(PROBE);
        // SAFETY: the buffer outlives the receive (freed only once its completion is reaped).
        unsafe { ring.submission().push(&entry) }.map_err(|_| io::Error::other("queue full"))?;
        // Submit only: the receive finds nothing and waits for the peer.
        ring.submitter().submit()?;
        let (returned, seen_by_writer) = std::thread::Builder::new()
            .name("mmc-ring-probe".into())
            .spawn(move || {
                let r = client.write_all(b"p");
                let seen = readable(efd);
                (client, r.map(|()| seen))
            })?
            .join()
            .map_err(|_| io::Error::other("probe thread panicked"))?;
        client = returned;
        // Twice: task work queued for this thread runs on the way out of the first call.
        let signalled = seen_by_writer? || readable(efd) || readable(efd);
        // Reap the receive (entering runs deferred work), then drop what it signalled.
        loop {
            ring.submitter().submit_and_wait(1)?;
            if ring.completion().any(|cqe| cqe.user_data() == PROBE) {
                break;
            }
        }
        drain(efd);
        if signalled {
            // SAFETY: the receive completed: nothing refers to the buffer any more.
            drop(unsafe { Box::from_raw(buf) });
            return Ok(true);
        }
    }
    // SAFETY: as above.
    drop(unsafe { Box::from_raw(buf) });
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::*;

    /// The front ring's own setup: whatever flags this kernel gave it, a completion wakes the
    /// pump (failed with `DEFER_TASKRUN` on 6.18.44-fc-v1252 before the setup probed it).
    #[test]
    fn the_front_ring_s_setup_signals_its_eventfd_on_a_completion() {
        let Some((mut ring, flags, efd)) = super::super::build_ring().expect("a front ring") else {
            return; // no setup signals on this kernel: the shard uses monoio's driver
        };
        assert!(
            signals_eventfd(&mut ring, efd.as_raw_fd()).expect("probe"),
            "{flags}"
        );
        // Twice: the probe leaves the ring and the eventfd as they were.
        assert!(signals_eventfd(&mut ring, efd.as_raw_fd()).expect("probe"));
    }

    /// The probe tells a ring that does not signal: one without an eventfd registered.
    #[test]
    fn an_eventfd_not_registered_is_not_signalled() {
        let mut ring = IoUring::new(8).expect("ring");
        // SAFETY: plain eventfd creation.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        // SAFETY: just created, owned here.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        assert!(!signals_eventfd(&mut ring, efd.as_raw_fd()).expect("probe"));
    }
}
