//! Buffers a same-host client shares with the server (docs/same-host.md, *Shared buffers*):
//! memory the client allocated as a sealed `memfd` and mapped, offered once per connection with
//! `X-Mmc-Shared: FD:INO:ADDR:LEN` (its descriptor number, the file's inode number, where it
//! mapped it, hexadecimal, and the length mapped). The server takes a duplicate of that
//! descriptor from the client (`pidfd_getfd`, allowed to the same process that may use
//! `process_vm_*` on it), checks it, and maps it; a copy whose `X-Mmc-Iov` entries all fall in
//! such buffers is then a `memcpy` between the blob and the mapping: no page pinning, no
//! kernel copy (one 1 MiB `process_vm_writev` runs at 11-13 GB/s here, `memmove` at 44).
//!
//! What keeps the server safe from a client's memfd: it must be a memfd sealed against
//! shrinking (`F_SEAL_SHRINK`: the mapping can never lose pages under a copy, which would be
//! a `SIGBUS`) and writable (no `F_SEAL_WRITE`/`F_SEAL_FUTURE_WRITE`), on shmem (not hugetlbfs,
//! whose pages can fail to come), at least as long as offered, its inode the one named (so a
//! descriptor number the client reused for another file is not taken for the first). What a
//! client can do with a false offer (an address that is not where it mapped the file) is have
//! its own copies made into or from its own memfd: nothing of any other client or object.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Buffers one connection may have registered at once (an offer past it is refused).
pub const MAX_REGIONS: usize = 64;

/// `fstatfs`'s `f_type` of shmem (memfds without `MFD_HUGETLB`).
const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;

/// One `X-Mmc-Shared` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The descriptor number in the client.
    pub fd: i32,
    /// The file's inode number, as the client's `fstat` gave it.
    pub ino: u64,
    /// Where the client mapped the file (from its offset 0).
    pub addr: usize,
    /// How many bytes of it the client mapped there.
    pub len: usize,
}

/// `X-Mmc-Shared`: `FD:INO:ADDR:LEN` entries separated by commas (decimal, decimal,
/// hexadecimal without `0x`, decimal), at most [`MAX_REGIONS`]. `None` when it does not parse.
pub fn parse(v: &[u8]) -> Option<Vec<Offer>> {
    let text = std::str::from_utf8(v).ok()?.trim();
    let mut out = Vec::new();
    for item in text.split(',') {
        if out.len() == MAX_REGIONS {
            return None;
        }
        let mut f = item.trim().split(':');
        let offer = Offer {
            fd: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            addr: usize::from_str_radix(f.next()?, 16).ok()?,
            len: f.next()?.parse().ok()?,
        };
        if f.next().is_some()
            || offer.fd < 0
            || offer.addr == 0
            || offer.len == 0
            || offer.addr.checked_add(offer.len).is_none()
        {
            return None;
        }
        out.push(offer);
    }
    Some(out)
}

/// A client's buffer, mapped here.
#[derive(Debug)]
struct Region {
    offer: Offer,
    /// This process's mapping of the file (`offer.len` bytes).
    base: *mut u8,
}

impl Region {
    fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.offer.addr + self.offer.len && self.offer.addr < addr + len
    }

    /// This mapping's address for the client's `[addr, addr + len)`, when it is all in it.
    fn at(&self, addr: usize, len: usize) -> Option<*mut u8> {
        let off = addr.checked_sub(self.offer.addr)?;
        (off.checked_add(len)? <= self.offer.len).then(|| self.base.wrapping_add(off))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `offer.len` bytes made in `map`, unmapped only here.
        unsafe { libc::munmap(self.base.cast(), self.offer.len) };
    }
}

/// The buffers a connection's client shares (one per connection: the peer's descriptors).
#[derive(Debug, Default)]
pub struct Shared {
    regions: Vec<Region>,
    /// Offers refused, not tried again on this connection.
    refused: Vec<Offer>,
}

impl Shared {
    /// Maps the client's buffer `offer` (the peer held by `pidfd`), replacing any registered
    /// one it overlaps (the client unmapped that one and mapped this one there). Already
    /// registered: nothing to do. Refused (the checks of the module's header, or
    /// [`MAX_REGIONS`]): the error; copies from and to that memory then go through the kernel
    /// as before.
    pub fn register(&mut self, pidfd: RawFd, offer: Offer) -> io::Result<()> {
        if self.regions.iter().any(|r| r.offer == offer) {
            return Ok(());
        }
        if self.refused.contains(&offer) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        let mapped = map(pidfd, &offer).and_then(|base| {
            self.regions.retain(|r| !r.overlaps(offer.addr, offer.len));
            let region = Region { offer, base };
            if self.regions.len() >= MAX_REGIONS {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.regions.push(region);
            Ok(())
        });
        if mapped.is_err() && self.refused.len() < MAX_REGIONS {
            self.refused.push(offer);
        }
        mapped
    }

    /// Where each entry of `iov` (the client's addresses) is mapped here, when every one lies
    /// in a single registered buffer; `None` otherwise (the copy goes through the kernel).
    pub fn translate(&self, iov: &[libc::iovec]) -> Option<Vec<(*mut u8, usize)>> {
        if self.regions.is_empty() {
            return None;
        }
        iov.iter()
            .filter(|e| e.iov_len > 0)
            .map(|e| {
                let (addr, len) = (e.iov_base as usize, e.iov_len);
                let at = self.regions.iter().find_map(|r| r.at(addr, len))?;
                Some((at, len))
            })
            .collect()
    }
}

/// The client's descriptor `offer.fd`, checked and mapped here (`offer.len` bytes, shared,
/// read and write).
fn map(pidfd: RawFd, offer: &Offer) -> io::Result<*mut u8> {
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that process and no flags; it
    // returns a new descriptor of ours (or -1).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, offer.fd, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel gave us this new descriptor.
    let file = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let fd = file.as_raw_fd();
    let refuse = || Err(io::Error::from_raw_os_error(libc::EPERM));
    // SAFETY: plain data filled by the calls below, which keep no pointer.
    let (mut st, mut fs): (libc::stat, libc::statfs) = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_ino != offer.ino
        || (st.st_size as u64) < offer.len as u64
        || fs.f_type != TMPFS_MAGIC
    {
        return refuse();
    }
    // SAFETY: F_GET_SEALS reads the file's seals (-1 for a file that cannot have any).
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    let unwritable = libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE;
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 || seals & unwritable != 0 {
        return refuse();
    }
    // SAFETY: a new shared mapping of the file's first `len` bytes, which exist (checked) and
    // cannot go away (sealed against shrinking); unmapped by `Region`'s drop.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            offer.len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base.cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed memfd of `len` bytes (`seals` added), mapped here: (descriptor, inode, address).
    fn memfd(len: usize, seals: libc::c_int) -> (OwnedFd, u64, *mut u8) {
        // SAFETY: plain calls on a new descriptor of ours; the mapping lives for the test.
        unsafe {
            let fd = libc::memfd_create(c"mmc-test".as_ptr(), libc::MFD_ALLOW_SEALING);
            assert!(fd >= 0);
            let fd = OwnedFd::from_raw_fd(fd);
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as i64), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
            }
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(fd.as_raw_fd(), &mut st), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (fd, st.st_ino, p.cast())
        }
    }

    fn own_pidfd() -> OwnedFd {
        // SAFETY: pidfd_open of this process.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor of ours.
        unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
    }

    fn iov(addr: usize, len: usize) -> libc::iovec {
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        }
    }

    #[test]
    fn offers_parse_and_malformed_ones_do_not() {
        let o = parse(b"7:123:7f00aa000000:4096, 8:9:1000:1").unwrap();
        assert_eq!(
            o,
            vec![
                Offer {
                    fd: 7,
                    ino: 123,
                    addr: 0x7f00_aa00_0000,
                    len: 4096
                },
                Offer {
                    fd: 8,
                    ino: 9,
                    addr: 0x1000,
                    len: 1
                }
            ]
        );
        for bad in [
            &b""[..],
            b"7:1:1000",
            b"7:1:1000:10:5",
            b"-1:1:1000:10",
            b"7:1:0:10",
            b"7:1:1000:0",
            b"7:1:ffffffffffffffff:2",
            b"7:x:1000:10",
            b"\xff",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let many = vec!["1:1:1000:1"; MAX_REGIONS + 1].join(",");
        assert_eq!(parse(many.as_bytes()), None);
    }

    #[test]
    fn a_sealed_memfd_is_mapped_and_addresses_in_it_translate() {
        let len = 64 << 10;
        let (fd, ino, addr) = memfd(len, libc::F_SEAL_SHRINK);
        let pidfd = own_pidfd();
        let mut shared = Shared::default();
        let a = addr as usize;
        // No buffer registered: nothing translates.
        assert!(shared.translate(&[iov(a, 10)]).is_none());
        let offer = Offer {
            fd: fd.as_raw_fd(),
            ino,
            addr: a,
            len,
        };
        shared.register(pidfd.as_raw_fd(), offer).unwrap();
        shared.register(pidfd.as_raw_fd(), offer).unwrap();
        assert_eq!(shared.regions.len(), 1);
        let parts = shared
            .translate(&[iov(a + 100, 50), iov(a, 0), iov(a + len - 8, 8)])
            .unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].1, 50);
        // The server's mapping is the same memory as the client's.
        // SAFETY: both are mappings of the memfd's first `len` bytes.
        let p = parts[0].0;
        unsafe {
            *p = 0xab;
            assert_eq!(*addr.add(100), 0xab);
        }
        // Past the end, or before the start, or a range crossing the end: not translated.
        assert!(shared.translate(&[iov(a + len - 8, 9)]).is_none());
        assert!(shared.translate(&[iov(a - 1, 1)]).is_none());
        assert!(
            shared
                .translate(&[iov(a, 8), iov(a + 2 * len, 8)])
                .is_none()
        );
        // Offered again at an overlapping address (another file mapped there): it replaces.
        let (fd2, ino2, _) = memfd(len, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        let again = Offer {
            fd: fd2.as_raw_fd(),
            ino: ino2,
            addr: a + 4096,
            len: 4096,
        };
        shared.register(pidfd.as_raw_fd(), again).unwrap();
        assert_eq!(shared.regions.len(), 1);
        assert!(shared.translate(&[iov(a + 100, 1)]).is_none());
        assert!(shared.translate(&[iov(a + 4096, 4096)]).is_some());
    }

    #[test]
    fn a_peer_copies_through_its_shared_buffer_whole_or_in_halves() {
        let peer = super::super::LocalPeer::this_process();
        let len = 2 * super::super::copy::SHARED_SPLIT_MIN_BYTES + 123;
        let (fd, ino, addr) = memfd(len, libc::F_SEAL_SHRINK);
        let header = format!("{}:{ino}:{:x}:{len}", fd.as_raw_fd(), addr as usize);
        assert_eq!(peer.share(header.as_bytes()), 0);
        assert_eq!(peer.share(b"not an offer"), 1);
        let src: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        for n in [1000, len] {
            let remote = [iov(addr as usize, n)];
            // A get's copy into the client's buffer, then a put's out of it.
            // SAFETY: `src` holds `n` bytes; the remote range is the mapped memfd.
            unsafe { peer.write(&remote, src.as_ptr(), n).unwrap() };
            // SAFETY: the memfd's mapping here holds `len` bytes.
            assert!(unsafe { std::slice::from_raw_parts(addr, n) } == &src[..n]);
            let mut back = vec![0u8; n];
            // SAFETY: `back` holds `n` bytes.
            unsafe { peer.read(&remote, back.as_mut_ptr(), n).unwrap() };
            assert!(back == src[..n]);
            let splits = peer.take_splits();
            assert_eq!(splits.shared, 2, "{n}");
            assert_eq!(splits.split, if n == len { 2 } else { 0 }, "{n}");
        }
        // Ordinary memory of the peer beside it: through the kernel, not counted as shared.
        let mut plain = vec![0u8; 1000];
        let remote = [iov(plain.as_mut_ptr() as usize, 1000)];
        // SAFETY: both hold 1000 bytes.
        unsafe { peer.write(&remote, src.as_ptr(), 1000).unwrap() };
        assert!(plain == src[..1000]);
        assert_eq!(peer.take_splits().shared, 0);
    }

    #[test]
    fn memory_that_could_shrink_or_is_not_the_file_named_is_refused() {
        let len = 8192;
        let pidfd = own_pidfd();
        let mut shared = Shared::default();
        let refused = |shared: &mut Shared, fd: &OwnedFd, ino, addr: *mut u8, len| {
            let offer = Offer {
                fd: fd.as_raw_fd(),
                ino,
                addr: addr as usize,
                len,
            };
            assert!(shared.register(pidfd.as_raw_fd(), offer).is_err());
            assert!(shared.translate(&[iov(addr as usize, 1)]).is_none());
        };
        // Not sealed against shrinking (it could lose pages under a copy).
        let (fd, ino, addr) = memfd(len, 0);
        refused(&mut shared, &fd, ino, addr, len);
        let (fd, ino, addr) = memfd(len, libc::F_SEAL_GROW);
        refused(&mut shared, &fd, ino, addr, len);
        // Sealed, but offered longer than the file, or as another file (its inode).
        let (fd, ino, addr) = memfd(len, libc::F_SEAL_SHRINK);
        refused(&mut shared, &fd, ino, addr, len + 1);
        refused(&mut shared, &fd, ino + 1, addr, len);
        // A file that is not shmem's (and cannot be sealed).
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        let fd = OwnedFd::from(f);
        refused(&mut shared, &fd, ino, 0x1000 as *mut u8, 1);
        // A descriptor the peer does not have.
        let offer = Offer {
            fd: 1 << 20,
            ino: 1,
            addr: 0x1000,
            len: 1,
        };
        assert!(shared.register(pidfd.as_raw_fd(), offer).is_err());
    }
}
