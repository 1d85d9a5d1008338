//! Host memory for segments (and for emulated device memory, `accel::HostEmulated`): one
//! anonymous `MAP_NORESERVE` mapping per segment, committed page by page on first write and
//! handed back to the kernel when ranges are freed. A 5 GB DRAM segment therefore costs no RSS
//! until objects are stored in it.

use std::io;
use std::ptr::NonNull;

use super::segment::PAGE_BYTES as PAGE;

pub struct MappedRegion {
    base: NonNull<u8>,
    len: u64,
    /// The `memfd` under a shared region ([`MappedRegion::new_shared`]): same-host clients
    /// map it read-only (`http::same_host`, mapped gets).
    file: Option<SharedFile>,
}

/// A shared region's file: its descriptor in this process and its inode number, which a
/// client that opens `/proc/PID/fd/FD` checks it got.
pub struct SharedFile {
    pub fd: std::os::fd::OwnedFd,
    pub ino: u64,
}

// SAFETY: plain memory. Who may touch which range is decided by the store's allocator (a range
// belongs to one blob, written by one thread before it becomes readable, never written while
// readers may hold it).
unsafe impl Send for MappedRegion {}
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    pub fn new(len: u64) -> io::Result<MappedRegion> {
        if len == 0 {
            return Ok(MappedRegion {
                base: NonNull::dangling(),
                len: 0,
                file: None,
            });
        }
        let size = usize::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        // SAFETY: an anonymous private mapping at no fixed address has no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedRegion {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
            file: None,
        })
    }

    /// A region on a `memfd` of `len` bytes, mapped shared: the same as [`MappedRegion::new`]
    /// for this process (sparse, committed on first write, freed ranges given back), and a
    /// file that same-host clients of the server's user may map read-only to copy a leased
    /// blob themselves. The file is sealed against shrinking and growing, so no process can
    /// take pages from under the server's mapping (a `SIGBUS`).
    pub fn new_shared(len: u64) -> io::Result<MappedRegion> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let size = usize::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        if len == 0 {
            return MappedRegion::new(0);
        }
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(
                c"mmc-dram-segment".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned to us, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        // SAFETY: plain syscalls on our descriptor.
        let ok = unsafe {
            libc::ftruncate(raw, len as libc::off_t) == 0
                && libc::fcntl(
                    raw,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                ) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our descriptor, a valid out-parameter.
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a shared mapping of our own file at no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedRegion {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
            file: Some(SharedFile { fd, ino: st.st_ino }),
        })
    }

    /// The file of a shared region ([`MappedRegion::new_shared`]).
    pub fn shared_file(&self) -> Option<&SharedFile> {
        self.file.as_ref()
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `[offset, offset + len)` lies inside the region.
    pub fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} outside a region of {} bytes",
                    self.len
                ),
            )),
        }
    }

    /// Pointer to `offset`. The caller bounds-checks with [`MappedRegion::check`] first.
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset <= self.len);
        // SAFETY: within the mapping (offset <= len).
        unsafe { self.base.as_ptr().add(offset as usize) }
    }

    /// Copies `src` to `offset`.
    ///
    /// # Safety
    /// The caller owns the range: nobody else reads or writes it during the call.
    pub unsafe fn write(&self, offset: u64, src: &[u8]) -> io::Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: in bounds; exclusive per the contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(offset), src.len()) };
        Ok(())
    }

    /// Copies from `offset` into `dst`.
    ///
    /// # Safety
    /// Nobody writes the range during the call.
    pub unsafe fn read(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: in bounds; no concurrent writer per the contract.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Returns the whole pages inside the range to the kernel (they read back as zeros).
    ///
    /// # Safety
    /// The caller owns the range and does not rely on its contents any more.
    pub unsafe fn discard(&self, offset: u64, len: u64) {
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = offset.saturating_add(len).min(self.len) / PAGE * PAGE;
        if end > start {
            // On a shared file the pages must leave the file (`MADV_REMOVE`, which also
            // unmaps them from clients' read-only mappings); MADV_DONTNEED would only unmap.
            let advice = if self.file.is_some() {
                libc::MADV_REMOVE
            } else {
                libc::MADV_DONTNEED
            };
            // SAFETY: inside the mapping; either advice only drops the pages' contents.
            unsafe { libc::madvise(self.ptr(start).cast(), (end - start) as usize, advice) };
        }
    }
}

impl MappedRegion {
    /// Commits the pages of `[offset, offset + len)` now (`MADV_POPULATE_WRITE`, Linux 5.14+)
    /// instead of at their first write. Contents are unchanged, so it may run while the range
    /// is in use.
    pub fn populate(&self, offset: u64, len: u64) -> io::Result<()> {
        let start = offset / PAGE * PAGE;
        let end = offset.saturating_add(len).min(self.len).div_ceil(PAGE) * PAGE;
        let end = end.min(self.len);
        if end <= start {
            return Ok(());
        }
        // SAFETY: inside the mapping; populating does not change what the pages hold.
        let rc = unsafe {
            libc::madvise(
                self.ptr(start).cast(),
                (end - start) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            use std::os::fd::AsRawFd;
            // Clients that mapped the file keep it open: its pages go now all the same (a
            // segment is dropped with nothing pinned in it, so nobody reads them any more).
            // SAFETY: our descriptor; punching a hole has no memory-safety preconditions.
            unsafe {
                libc::fallocate(
                    f.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    self.len as libc::off_t,
                )
            };
        }
        if self.len > 0 {
            // SAFETY: unmapping exactly the mapping made in `new`.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len as usize) };
        }
    }
}

impl MappedRegion {
    /// Bytes of `[offset, offset + len)` resident in memory now (`mincore`), page-granular:
    /// what the mapping actually costs, for tests and diagnostics.
    pub fn resident_bytes(&self, offset: u64, len: u64) -> io::Result<u64> {
        let start = offset / PAGE * PAGE;
        let end = offset.saturating_add(len).min(self.len).div_ceil(PAGE) * PAGE;
        if start >= end {
            return Ok(0);
        }
        let pages = ((end - start) / PAGE) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: the range lies inside this mapping; `vec` has one byte per page.
        let rc = unsafe {
            libc::mincore(
                self.ptr(start).cast(),
                (end - start) as usize,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_region_is_a_sealed_memfd_read_back_through_its_file_and_discarded() {
        use std::os::fd::AsRawFd;
        let r = MappedRegion::new_shared(1 << 20).unwrap();
        let f = r.shared_file().unwrap();
        let data: Vec<u8> = (0..=255).collect();
        unsafe { r.write(8192, &data).unwrap() };
        // Another mapping of the file (as a client's, read-only) sees the bytes.
        let path = format!("/proc/self/fd/{}", f.fd.as_raw_fd());
        let file = std::fs::File::open(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(file.metadata().unwrap().ino(), f.ino);
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let seen = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(8192), 256) };
        assert_eq!(seen, &data[..]);
        // Sealed: nobody can shrink it under the server's mapping.
        assert_ne!(unsafe { libc::ftruncate(f.fd.as_raw_fd(), 4096) }, 0);
        assert_eq!(r.resident_bytes(8192, 256).unwrap(), 4096);
        unsafe { r.discard(8192, 4096) };
        assert_eq!(
            r.resident_bytes(8192, 256).unwrap(),
            0,
            "the page left the file"
        );
        assert_eq!(seen[0], 0, "and reads back as zeros everywhere");
        // Dropped while a client still maps the file: its pages go all the same.
        unsafe { r.write(65536, &data).unwrap() };
        let kept = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(65536), 256) };
        assert_eq!(kept, &data[..]);
        drop(r);
        assert_eq!(kept, &[0u8; 256][..], "the pages left with the region");
        unsafe { libc::munmap(p, 1 << 20) };
    }

    #[test]
    fn write_read_discard() {
        let r = MappedRegion::new(1 << 20).unwrap();
        let data: Vec<u8> = (0..=255).collect();
        unsafe { r.write(8000, &data).unwrap() };
        let mut back = vec![0; 256];
        unsafe { r.read(8000, &mut back).unwrap() };
        assert_eq!(back, data);
        assert!(unsafe { r.write((1 << 20) - 1, &data) }.is_err());
        unsafe { r.discard(0, 1 << 20) };
        unsafe { r.read(8000, &mut back).unwrap() };
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn populate_keeps_contents_and_clamps_to_the_region() {
        let r = MappedRegion::new(1 << 20).unwrap();
        let data: Vec<u8> = (0..=255).collect();
        unsafe { r.write(5000, &data).unwrap() };
        r.populate(0, 1 << 20).unwrap();
        r.populate(4000, 10).unwrap();
        r.populate((1 << 20) - 100, 1 << 30).unwrap();
        let mut back = vec![0; 256];
        unsafe { r.read(5000, &mut back).unwrap() };
        assert_eq!(back, data);
        unsafe { r.read(100_000, &mut back).unwrap() };
        assert!(
            back.iter().all(|&b| b == 0),
            "populated pages read as zeros"
        );
    }

    #[test]
    fn a_large_region_costs_no_memory_until_used() {
        let r = MappedRegion::new(64 << 30).unwrap();
        assert_eq!(r.len(), 64 << 30);
        // Sample the start, the middle and the end: nothing resident before any write.
        for at in [0, 32 << 30, (64 << 30) - (64 << 20)] {
            assert_eq!(r.resident_bytes(at, 64 << 20).unwrap(), 0, "at {at}");
        }
        unsafe { r.write(63 << 30, b"x").unwrap() };
        // The write committed its page and (almost) nothing else.
        assert_eq!(r.resident_bytes(63 << 30, PAGE).unwrap(), PAGE);
        let around = r.resident_bytes((63 << 30) - (32 << 20), 64 << 20).unwrap();
        assert!(
            around < 4 << 20,
            "{around} bytes resident around one written byte"
        );
        assert_eq!(r.resident_bytes(0, 64 << 20).unwrap(), 0);
        // Discarding gives the page back.
        unsafe { r.discard(63 << 30, PAGE) };
        assert_eq!(r.resident_bytes(63 << 30, PAGE).unwrap(), 0);
    }
}
