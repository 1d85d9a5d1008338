//! The same-host data path (docs/same-host.md): a Unix socket beside the TCP port, on which a
//! client of this host running as the server's user sends the same HTTP requests with
//! `X-Mmc-Iov: ADDR:LEN,…` (hexadecimal address, decimal length) naming its own memory
//! instead of a body. The server copies a put's bytes from that memory into the granted blob
//! (`process_vm_readv`) and a get's bytes from the leased blob into it (`process_vm_writev`):
//! one copy, under the same grants and leases as the TCP path (`conn/same_host.rs`).
//!
//! Here: where the socket lives and binding it (`sockets`), the peer's identity checked at accept (its uid
//! must be the server's; its pid, held by a pidfd, is the only process whose memory the
//! server touches for that connection), parsing `X-Mmc-Iov`, and the copies themselves.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

mod copy;
mod held;
use copy::{SPLIT_MIN_BYTES, vm_copy};
pub mod shared;

pub use held::MAX_HELD_LEASES;
mod sockets;
pub use sockets::{advert, bind, header_path, remove_stale_shard_sockets, shard_path, socket_path};

/// Entries of one `X-Mmc-Iov` (the kernel's `IOV_MAX`: one `process_vm_*` call takes them).
pub const MAX_IOV: usize = 1024;

impl super::Front {
    /// Accepts same-host connections on `listener` (the socket every shard accepts on, or
    /// this shard's own) until the drain begins. `advert` is what `/health` says of it. A peer of another user
    /// is answered 403 and closed: its requests go over TCP.
    pub async fn serve_same_host(
        self: std::rc::Rc<Self>,
        listener: monoio::net::UnixListener,
        advert: Box<str>,
    ) {
        let _ = self.same_host_advert.set(advert);
        let handle = self.accept_canceller.borrow().handle();
        let max_conns = self.config().http.max_connections_per_shard as usize;
        let mut last_error_log_ms: Option<u64> = None;
        loop {
            match listener.cancelable_accept(handle.clone()).await {
                Ok((stream, _)) => {
                    let stats = self.shard.stats();
                    stats.connections_accepted.inc();
                    let fd = stream.as_raw_fd();
                    let peer = match LocalPeer::of(fd) {
                        Ok(p) if self.connection_count() < max_conns => {
                            p.counted_in(self.shard.shared.clone(), self.shard.id)
                        }
                        Ok(_) => {
                            stats.connections_rejected.inc();
                            monoio::spawn(refuse(self.clone(), stream, "Too many connections"));
                            continue;
                        }
                        Err(why) => {
                            log::debug!("shard {}: same-host peer refused: {why:?}", self.shard.id);
                            monoio::spawn(refuse(
                                self.clone(),
                                stream,
                                "Forbidden: the same-host socket serves processes of the server's user only; use TCP",
                            ));
                            continue;
                        }
                    };
                    monoio::spawn(super::conn::run(self.clone(), stream, fd, true, Some(peer)));
                }
                Err(_) if self.draining.get() => return,
                Err(e) => {
                    // Out of descriptors or memory: logged at most once a second, as the TCP
                    // accept loop does (a connection waiting in the backlog fails every retry).
                    let now = self.shard.clock.now_ms();
                    if last_error_log_ms.is_none_or(|t| now >= t + 1000) {
                        log::warn!("shard {}: same-host accept failed: {e}", self.shard.id);
                        last_error_log_ms = Some(now);
                    }
                    monoio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }
}

/// Answers a refused same-host connection (403, or 429 when over the connection limit) and
/// closes it.
async fn refuse(front: std::rc::Rc<super::Front>, mut stream: monoio::net::UnixStream, why: &str) {
    use monoio::io::AsyncWriteRentExt;
    let status = if why.starts_with("Forbidden") {
        super::response::Status::FORBIDDEN
    } else {
        super::response::Status::TOO_MANY_REQUESTS
    };
    let mut scratch = Vec::new();
    let kind = crate::common::error_kind::ErrorKind::for_status(status.0);
    let mut resp = super::Response::error(status, kind, why, front.unix_secs(), &mut scratch);
    resp.close = true;
    let mut out = Vec::with_capacity(256);
    front.encode(resp, None, &scratch, &mut out);
    let _ = stream.write_all(out).await;
}

/// Why a peer is refused the same-host path.
#[derive(Debug)]
pub enum Refusal {
    /// Another user's process.
    OtherUser,
    /// Its credentials could not be read.
    Unknown(io::Error),
}

/// The process at the other end of an accepted connection, as the kernel saw it at
/// `connect` (`SO_PEERCRED`), held by a pidfd so that its exit is seen before any copy.
#[derive(Debug)]
pub struct LocalPeer {
    pub pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The connection's socket (owned by the connection, which outlives this), or -1.
    conn: RawFd,
    /// Large copies made in two halves since the last `take_splits`, and of their first halves
    /// those the calling thread took back from its helper (not started yet).
    splits: std::cell::Cell<Splits>,
    /// The buffers the client shares with the server (`X-Mmc-Shared`), mapped here.
    shared: std::cell::RefCell<shared::Shared>,
    /// Mapped gets whose client may still be copying (`X-Mmc-Map`), held until the client
    /// says it is done or the connection closes.
    held: held::HeldAnswers,
}

impl Drop for LocalPeer {
    fn drop(&mut self) {
        // The client checks, after copying from a mapped blob, that its connection is still
        // open: so the connection is shut down before the pins go, never after.
        if self.held.len() > 0 && self.conn >= 0 {
            // SAFETY: the connection's socket, still open (the connection outlives this).
            unsafe { libc::shutdown(self.conn, libc::SHUT_RDWR) };
        }
        self.held.clear();
    }
}

/// What became of the large copies of a connection's requests (`LocalPeer::take_splits`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Splits {
    /// Copies made in two halves, the first handed to the shard's copy helper.
    pub split: u64,
    /// First halves the shard made itself after all, its helper not having started them.
    pub taken_back: u64,
    /// Copies made with `memcpy` through buffers the client shares (`shared`), whatever
    /// their size.
    pub shared: u64,
}

impl LocalPeer {
    /// The peer of the connected socket `fd`, if it may use the same-host path: a process of
    /// the server's own (effective) user.
    pub fn of(fd: RawFd) -> Result<LocalPeer, Refusal> {
        let blank = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let cred = socket_option(fd, libc::SO_PEERCRED, blank).map_err(Refusal::Unknown)?;
        // SAFETY: geteuid has no preconditions.
        if cred.uid != unsafe { libc::geteuid() } {
            return Err(Refusal::OtherUser);
        }
        if cred.pid <= 0 {
            return Err(Refusal::Unknown(io::Error::other("no peer pid")));
        }
        let pidfd = peer_pidfd(fd, cred.pid).map_err(Refusal::Unknown)?;
        Ok(LocalPeer {
            pid: cred.pid,
            pidfd,
            conn: fd,
            splits: Default::default(),
            shared: Default::default(),
            held: Default::default(),
        })
    }

    /// Counts the answers this peer holds in shard `shard`'s statistics
    /// (`memcache_same_host_held_answers`, `memcache_same_host_held_bytes`).
    pub fn counted_in(
        mut self,
        shared: std::sync::Arc<crate::shards::Shared>,
        shard: usize,
    ) -> Self {
        self.held.count_in(shared, shard);
        self
    }

    /// The peer for a test: this process.
    #[cfg(test)]
    pub fn this_process() -> LocalPeer {
        let pid = std::process::id() as libc::pid_t;
        LocalPeer {
            pid,
            pidfd: pidfd_open(pid).expect("pidfd_open"),
            conn: -1,
            splits: Default::default(),
            shared: Default::default(),
            held: Default::default(),
        }
    }

    /// Whether this connection may hold a mapped answer read under a grant checked in the
    /// local service's grant-read `epoch` (`held::HeldAnswers::may_hold_granted`).
    pub fn may_hold_granted(
        &self,
        shared: &std::sync::Arc<crate::shards::Shared>,
        epoch: u64,
    ) -> bool {
        self.held.may_hold_granted(self.conn, shared, epoch)
    }

    /// The large copies split since the last call (for the shard's statistics).
    pub fn take_splits(&self) -> Splits {
        self.splits.take()
    }

    /// Registers the buffers `X-Mmc-Shared` offers (`shared::parse`). Returns how many
    /// offers were refused (a malformed header counts as one): their copies go through the
    /// kernel.
    pub fn share(&self, header: &[u8]) -> u64 {
        let Some(offers) = shared::parse(header) else {
            return 1;
        };
        let mut shared = self.shared.borrow_mut();
        let mut refused = 0;
        for offer in offers {
            if let Err(e) = shared.register(self.pidfd.as_raw_fd(), offer) {
                log::debug!(
                    "same-host: buffer {offer:?} of pid {} refused: {e}",
                    self.pid
                );
                refused += 1;
            }
        }
        refused
    }

    /// `X-Mmc-Map: N`: the client is done copying from the mapped answers up to lease `N`;
    /// their pins go. Returns how many answers' pins went.
    pub fn release(&self, upto: u64) -> usize {
        self.held.release(upto)
    }

    /// Holds a mapped answer's pinned blobs until the client is done with them. `Err` when
    /// the connection already holds [`MAX_HELD_LEASES`] (the parts are given back).
    pub fn hold(
        &self,
        parts: Vec<super::response::Part>,
    ) -> Result<u64, Vec<super::response::Part>> {
        self.held.hold(parts)
    }

    /// Whether the server would rather copy `len` bytes into `iov` itself than have the
    /// client copy them from a mapped answer: when every entry lies in a buffer the client
    /// shares and the copy is large enough to be made in two halves at once (a 4 MiB get
    /// 2x as fast that way as the client's one `memmove`, perf/RESULTS.md *Session 12*).
    pub fn copies_faster(&self, iov: &[libc::iovec], len: usize) -> bool {
        len >= copy::SHARED_SPLIT_MIN_BYTES && self.shared.borrow().translate(iov).is_some()
    }

    /// Mapped answers whose pins this connection holds.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether the peer has closed the connection (the client gave up on its request).
    pub fn hung_up(&self) -> bool {
        self.poll().1
    }

    /// Whether a copy may be made now: the process still runs (once it has exited, its pid
    /// may name another process), and it has not closed the connection. A client closes it
    /// when it gives up on a request (its timeout, with this server frozen or slow): a copy
    /// made after that would write into a buffer it has taken back, or read one it may have
    /// refilled, so none is made (`ESRCH`, `ECONNRESET`).
    fn may_copy(&self) -> io::Result<()> {
        match self.poll() {
            (true, _) => Err(io::Error::from_raw_os_error(libc::ESRCH)),
            (_, true) => Err(io::Error::from_raw_os_error(libc::ECONNRESET)),
            _ => Ok(()),
        }
    }

    /// (Exited, hung up), in one `poll` of the pidfd and the connection's socket.
    fn poll(&self) -> (bool, bool) {
        let mut p = [
            libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            // Only POLLHUP (always reported): the peer closed its end; a half-close
            // (shutdown of its writing side) leaves its answers wanted.
            libc::pollfd {
                fd: self.conn,
                events: 0,
                revents: 0,
            },
        ];
        // SAFETY: two pollfds (a negative fd is skipped); no wait.
        unsafe { libc::poll(p.as_mut_ptr(), 2, 0) };
        (
            p[0].revents != 0,
            p[1].revents & (libc::POLLHUP | libc::POLLERR) != 0,
        )
    }

    /// Copies the peer's memory at `remote` into `local` (`len` bytes, the sum of `remote`'s
    /// lengths): the whole of it, or an error (the peer exited, an address is not its).
    ///
    /// # Safety
    /// `local` is valid for writes of `len` bytes, and nothing else reads or writes it during
    /// the call.
    pub unsafe fn read(
        &self,
        remote: &[libc::iovec],
        local: *mut u8,
        len: usize,
    ) -> io::Result<()> {
        self.copy(remote, local, len, false)
    }

    /// Copies `len` bytes at `local` into the peer's memory at `remote`.
    ///
    /// # Safety
    /// `local` is valid for reads of `len` bytes and not written during the call.
    pub unsafe fn write(
        &self,
        remote: &[libc::iovec],
        local: *const u8,
        len: usize,
    ) -> io::Result<()> {
        self.copy(remote, local.cast_mut(), len, true)
    }

    fn copy(
        &self,
        remote: &[libc::iovec],
        local: *mut u8,
        len: usize,
        out: bool,
    ) -> io::Result<()> {
        if total(remote) != Some(len as u64) || remote.len() > MAX_IOV {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if len == 0 {
            return Ok(());
        }
        self.may_copy()?;
        if let Some(parts) = self.shared.borrow().translate(remote) {
            let mut splits = self.splits.get();
            splits.shared += 1;
            let mut at = 0;
            for (p, n) in parts {
                // SAFETY: `p` is `n` bytes of a mapping of the client's sealed memfd (it cannot
                // shrink), alive while registered; `local` is valid for `len` bytes per the
                // caller's contract. The client may write its buffer meanwhile (its own
                // bytes, as with process_vm_*): the copy takes whatever is there.
                let (dst, src) = unsafe {
                    if out {
                        (p, local.add(at).cast_const())
                    } else {
                        (local.add(at), p.cast_const())
                    }
                };
                // A put's bytes go into a blob (`local`), read later if ever: streamed past
                // the cache. A get's go to the client, which reads them next: cached.
                let stream = !out;
                if n >= copy::SHARED_SPLIT_MIN_BYTES {
                    // SAFETY: as above.
                    let taken_back = unsafe { copy::memcpy_in_halves(dst, src, n, stream) };
                    splits.split += 1;
                    splits.taken_back += u64::from(taken_back);
                } else {
                    // SAFETY: as above.
                    unsafe { copy::memcpy(dst, src, n, stream) };
                }
                at += n;
            }
            self.splits.set(splits);
            return Ok(());
        }
        if len < SPLIT_MIN_BYTES {
            // SAFETY: forwarded contract.
            return unsafe { vm_copy(self.pid, remote, local, len, out) };
        }
        // SAFETY: forwarded contract.
        let (done, taken_back) = unsafe { copy::in_halves(self.pid, remote, local, len, out) };
        let mut splits = self.splits.get();
        splits.split += 1;
        splits.taken_back += u64::from(taken_back);
        self.splits.set(splits);
        done
    }
}

/// The entries of `iov` that cover bytes `[from, from + len)` of what it names.
pub fn sub_iov(iov: &[libc::iovec], from: usize, len: usize) -> Vec<libc::iovec> {
    let mut out = Vec::new();
    let (mut skip, mut left) = (from, len);
    for e in iov {
        if left == 0 {
            break;
        }
        if skip >= e.iov_len {
            skip -= e.iov_len;
            continue;
        }
        let n = (e.iov_len - skip).min(left);
        out.push(libc::iovec {
            iov_base: (e.iov_base as usize + skip) as *mut libc::c_void,
            iov_len: n,
        });
        skip = 0;
        left -= n;
    }
    out
}

/// The sum of the entries' lengths (`None` on overflow).
pub fn total(iov: &[libc::iovec]) -> Option<u64> {
    iov.iter()
        .try_fold(0u64, |t, e| t.checked_add(e.iov_len as u64))
}

/// `X-Mmc-Iov`: `ADDR:LEN` entries separated by commas, the address in hexadecimal (no `0x`),
/// the length in decimal; at most [`MAX_IOV`] entries. `None` when it does not parse.
pub fn parse_iov(v: &[u8]) -> Option<Vec<libc::iovec>> {
    let text = std::str::from_utf8(v).ok()?.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for item in text.split(',') {
        if out.len() == MAX_IOV {
            return None;
        }
        let (addr, len) = item.trim().split_once(':')?;
        let addr = usize::from_str_radix(addr, 16).ok()?;
        let len: usize = len.parse().ok()?;
        if len > 0 && (addr == 0 || addr.checked_add(len).is_none()) {
            return None;
        }
        out.push(libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        });
    }
    total(&out)?;
    Some(out)
}

/// The peer's pidfd: `SO_PEERPIDFD` (Linux 6.5: the process that connected, whatever
/// happened since), else `pidfd_open` of the pid `SO_PEERCRED` gave.
fn peer_pidfd(fd: RawFd, pid: libc::pid_t) -> io::Result<OwnedFd> {
    if let Ok(pidfd) = socket_option::<libc::c_int>(fd, libc::SO_PEERPIDFD, -1)
        && pidfd >= 0
    {
        // SAFETY: the kernel gave us this new descriptor.
        return Ok(unsafe { OwnedFd::from_raw_fd(pidfd) });
    }
    pidfd_open(pid)
}

/// The `SOL_SOCKET` option `opt` of socket `fd`, read into a `T` that starts as `value`.
/// `T` must be the option's C type (`ucred` for `SO_PEERCRED`, `int` for `SO_PEERPIDFD`).
fn socket_option<T: Copy>(fd: RawFd, opt: libc::c_int, mut value: T) -> io::Result<T> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a `T` and `len` its size; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_headers_parse_within_their_bounds() {
        let v = parse_iov(b"7f00aa000000:4096, 7f00bb000000:10").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].iov_base as usize, 0x7f00_aa00_0000);
        assert_eq!(v[1].iov_len, 10);
        assert_eq!(total(&v), Some(4106));
        assert!(parse_iov(b"").unwrap().is_empty());
        for bad in [
            &b"xyz:1"[..],
            b"10",
            b"0:5",
            b"10:-1",
            b"ffffffffffffffff:2",
            b"10:5,",
        ] {
            assert!(
                parse_iov(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let many = vec!["1000:1"; MAX_IOV + 1].join(",");
        assert!(parse_iov(many.as_bytes()).is_none());
        let most = vec!["1000:1"; MAX_IOV].join(",");
        assert_eq!(parse_iov(most.as_bytes()).unwrap().len(), MAX_IOV);
    }

    #[test]
    fn copies_go_to_and_from_the_peer_and_fail_whole_on_a_bad_address() {
        let peer = LocalPeer::this_process();
        let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let remote = [
            libc::iovec {
                iov_base: src.as_ptr() as *mut _,
                iov_len: 4000,
            },
            libc::iovec {
                iov_base: src[4000..].as_ptr() as *mut _,
                iov_len: 6000,
            },
        ];
        let mut dst = vec![0u8; 10_000];
        unsafe { peer.read(&remote, dst.as_mut_ptr(), dst.len()).unwrap() };
        assert_eq!(dst, src);
        let mut back = vec![0u8; 10_000];
        let into = [libc::iovec {
            iov_base: back.as_mut_ptr().cast(),
            iov_len: back.len(),
        }];
        unsafe { peer.write(&into, dst.as_ptr(), dst.len()).unwrap() };
        assert_eq!(back, src);
        // A length that is not the entries' sum, and an address that is not mapped.
        assert!(unsafe { peer.read(&remote, dst.as_mut_ptr(), 10) }.is_err());
        let bad = [libc::iovec {
            iov_base: 8 as *mut _,
            iov_len: 100,
        }];
        assert!(unsafe { peer.read(&bad, dst.as_mut_ptr(), 100) }.is_err());
    }

    #[test]
    fn large_copies_are_split_and_fail_whole() {
        let peer = LocalPeer::this_process();
        let len = 3 * SPLIT_MIN_BYTES + 12345;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        // Three entries, of which the split falls inside the second.
        let cut = [100_000, 400_000];
        let remote = [
            libc::iovec {
                iov_base: src.as_ptr() as *mut _,
                iov_len: cut[0],
            },
            libc::iovec {
                iov_base: src[cut[0]..].as_ptr() as *mut _,
                iov_len: cut[1],
            },
            libc::iovec {
                iov_base: src[cut[0] + cut[1]..].as_ptr() as *mut _,
                iov_len: len - cut[0] - cut[1],
            },
        ];
        for _ in 0..3 {
            let mut dst = vec![0u8; len];
            unsafe { peer.read(&remote, dst.as_mut_ptr(), len).unwrap() };
            assert!(dst == src);
            let mut back = vec![0u8; len];
            let into = [libc::iovec {
                iov_base: back.as_mut_ptr().cast(),
                iov_len: len,
            }];
            unsafe { peer.write(&into, dst.as_ptr(), len).unwrap() };
            assert!(back == src);
        }
        // A bad address in either half fails the whole copy (and both halves are waited for).
        for bad_at in [0, len - 8] {
            let mut remote = remote.to_vec();
            remote.push(libc::iovec {
                iov_base: 8 as *mut _,
                iov_len: 8,
            });
            if bad_at == 0 {
                remote.rotate_right(1);
            }
            let mut dst = vec![0u8; len + 8];
            assert!(unsafe { peer.read(&remote, dst.as_mut_ptr(), len + 8) }.is_err());
        }
    }

    #[test]
    fn a_range_of_an_iov_is_the_entries_that_cover_it() {
        let iov = |entries: &[(usize, usize)]| -> Vec<libc::iovec> {
            entries
                .iter()
                .map(|&(a, n)| libc::iovec {
                    iov_base: a as *mut libc::c_void,
                    iov_len: n,
                })
                .collect()
        };
        let pairs = |v: &[libc::iovec]| -> Vec<(usize, usize)> {
            v.iter().map(|e| (e.iov_base as usize, e.iov_len)).collect()
        };
        let v = iov(&[(1000, 10), (5000, 20), (9000, 5)]);
        assert_eq!(
            pairs(&sub_iov(&v, 0, 35)),
            [(1000, 10), (5000, 20), (9000, 5)]
        );
        assert_eq!(pairs(&sub_iov(&v, 5, 10)), [(1005, 5), (5000, 5)]);
        assert_eq!(pairs(&sub_iov(&v, 10, 20)), [(5000, 20)]);
        assert_eq!(pairs(&sub_iov(&v, 29, 6)), [(5019, 1), (9000, 5)]);
        assert!(sub_iov(&v, 35, 0).is_empty());
    }

    #[test]
    fn a_peer_of_this_user_is_accepted_with_its_pid_and_copied_for_until_it_hangs_up() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = LocalPeer::of(a.as_raw_fd()).unwrap();
        assert_eq!(peer.pid, std::process::id() as libc::pid_t);
        assert!(peer.may_copy().is_ok() && !peer.hung_up());
        let src = [7u8; 64];
        let mut dst = [0u8; 64];
        let remote = [libc::iovec {
            iov_base: src.as_ptr() as *mut _,
            iov_len: src.len(),
        }];
        // SAFETY: `dst` is ours for the call.
        unsafe { peer.read(&remote, dst.as_mut_ptr(), 64) }.unwrap();
        assert_eq!(dst, src);
        // Half-closed: the answers are still wanted.
        b.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(peer.may_copy().is_ok());
        // Closed: no copy any more.
        drop(b);
        dst.fill(0);
        // SAFETY: as above.
        let e = unsafe { peer.read(&remote, dst.as_mut_ptr(), 64) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET));
        assert_eq!(dst, [0u8; 64], "copied after the peer hung up");
        assert!(peer.hung_up());
    }

    #[test]
    fn mapped_answers_are_held_until_the_client_is_done_and_a_close_comes_before_their_release() {
        use crate::http::response::Part;
        use std::io::Read;
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = LocalPeer::of(a.as_raw_fd()).unwrap();
        let part = || vec![Part::Bytes(bytes::Bytes::from_static(b"blob"))];
        let leases: Vec<u64> = (0..3).map(|_| peer.hold(part()).unwrap()).collect();
        assert_eq!(leases, [1, 2, 3]);
        // Done up to 2: the first two go, in order; a number already done changes nothing.
        assert_eq!(peer.release(2), 2);
        assert_eq!(peer.release(1), 0);
        assert_eq!(peer.held(), 1);
        // At most MAX_HELD_LEASES: the next answer is copied by the server instead.
        while peer.held() < MAX_HELD_LEASES {
            peer.hold(part()).unwrap();
        }
        assert!(peer.hold(part()).is_err());
        assert_eq!(peer.release(u64::MAX), MAX_HELD_LEASES);
        // Closing with answers held: the connection is shut down (the client sees it) before
        // their pins go.
        peer.hold(part()).unwrap();
        drop(peer);
        b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap(), 0, "shut down");
    }
}
