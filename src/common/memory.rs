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
        })
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
            // SAFETY: inside the mapping; MADV_DONTNEED on private anonymous memory only drops
            // the pages' contents.
            unsafe {
                libc::madvise(
                    self.ptr(start).cast(),
                    (end - start) as usize,
                    libc::MADV_DONTNEED,
                )
            };
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
