//! Same-host connections of a local service that hold mapped answers read under a meta's
//! grant (`http::conn::same_host::map`, docs/same-host.md, *Mapped gets*). Nothing here pins those bytes: the meta's lease
//! keeps their range the object's until the grant's expiry, which the client's copy must end
//! before (`X-Mmc-Mapped`'s third field). When the service joins a meta again, the ranges of
//! the previous membership may soon be another object's (written under the next meta's
//! grants), leases or not: every such connection is shut down first ([`GrantReads::sweep`],
//! from the agent's `Join`), so a copy still going then finds its connection closed after it
//! and counts for nothing, as when a server goes away. An answer checked under the previous
//! membership but mapped after the sweep is refused by its epoch (copied by the server
//! instead).

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The connections holding mapped grant reads, by registration.
#[derive(Debug, Default)]
pub struct GrantReads {
    /// Bumped by every sweep, under `socks`' lock (so a load and a store).
    epoch: AtomicU64,
    // LOCK-OK: held briefly by a connection's first mapped grant read, its close, and a join
    socks: Mutex<Socks>,
}

#[derive(Debug, Default)]
struct Socks {
    next: u64,
    /// A duplicate of each registered connection's socket: a sweep shuts the socket down
    /// through it whatever became of the connection's own descriptor.
    by_id: HashMap<u64, OwnedFd>,
}

impl GrantReads {
    /// The current epoch: read before a grant is checked, compared when its answer is mapped.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Registers the connection on socket `fd` for the next sweep, if no sweep came since
    /// `epoch`; its registration (for [`GrantReads::forget`]), or `None`: map nothing.
    pub fn register(&self, fd: RawFd, epoch: u64) -> Option<u64> {
        let mut socks = self.socks.lock().unwrap_or_else(|e| e.into_inner());
        if self.epoch.load(Ordering::SeqCst) != epoch || fd < 0 {
            return None;
        }
        // SAFETY: `fd` is the caller's open socket; the duplicate is a descriptor of our own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return None;
        }
        socks.next += 1;
        let id = socks.next;
        // SAFETY: `dup` was just made and is owned by nothing else.
        socks.by_id.insert(id, unsafe { OwnedFd::from_raw_fd(dup) });
        Some(id)
    }

    /// The connection `id` closes: its duplicate goes.
    pub fn forget(&self, id: u64) {
        let mut socks = self.socks.lock().unwrap_or_else(|e| e.into_inner());
        socks.by_id.remove(&id);
    }

    /// Shuts every registered connection down, and starts a new epoch: the service is
    /// joining a meta again. How many connections were shut down.
    pub fn sweep(&self) -> usize {
        use std::os::fd::AsRawFd;
        let mut socks = self.socks.lock().unwrap_or_else(|e| e.into_inner());
        let next = self.epoch.load(Ordering::SeqCst) + 1;
        self.epoch.store(next, Ordering::SeqCst);
        let n = socks.by_id.len();
        for fd in socks.by_id.values() {
            // SAFETY: our own descriptor of the connection's socket.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        socks.by_id.clear();
        n
    }

    /// Connections registered now (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.socks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_sweep_shuts_registered_connections_down_and_refuses_older_epochs() {
        let reads = GrantReads::default();
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let epoch = reads.epoch();
        let id = reads.register(a.as_raw_fd(), epoch).expect("registered");
        assert_eq!(reads.len(), 1);
        assert_eq!(reads.sweep(), 1);
        let mut buf = [0u8; 1];
        assert_eq!(
            b.read(&mut buf).unwrap(),
            0,
            "the client sees its connection closed"
        );
        assert!(reads.is_empty());
        // An answer whose grant was checked before the sweep is not mapped after it.
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(reads.register(c.as_raw_fd(), epoch), None);
        let id2 = reads
            .register(c.as_raw_fd(), reads.epoch())
            .expect("new epoch");
        assert_ne!(id, id2);
        reads.forget(id2);
        assert!(reads.is_empty());
        assert_eq!(reads.sweep(), 0);
    }

    #[test]
    fn a_forgotten_connection_is_not_shut_down_by_a_later_sweep() {
        let reads = GrantReads::default();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let id = reads.register(a.as_raw_fd(), reads.epoch()).unwrap();
        reads.forget(id);
        reads.sweep();
        b.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let e = (&b).read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "still open");
    }
}
