//! Accelerator memory: the HBM tier behind a trait.
//!
//! A [`DeviceMemory`] is one rank's device memory, addressed by byte offset. The store never
//! touches device bytes directly: it copies in, copies out and discards through this trait,
//! so a real accelerator runtime can replace the default [`HostEmulated`] backend, which
//! emulates device memory with a lazily committed anonymous mapping (a 5 GB "HBM" costs no
//! RSS until written).

use std::io;

use crate::common::memory::MappedRegion;

/// One device's memory.
///
/// # Safety contract for callers
/// The byte ranges passed to `write`, `read` and `discard` must be owned by the caller for
/// the duration of the call: no other thread may write the same range concurrently. The
/// store's allocator guarantees this (each range belongs to one blob on one shard).
pub trait DeviceMemory: Send + Sync {
    /// A name for logs (`host-emulated`, a device id, ...).
    fn name(&self) -> &str;

    fn capacity_bytes(&self) -> u64;

    /// Copies `src` into device memory at `offset`.
    ///
    /// # Safety
    /// The caller owns `[offset, offset + src.len())` (see the trait's contract).
    unsafe fn write(&self, offset: u64, src: &[u8]) -> io::Result<()>;

    /// Copies device memory at `offset` into `dst`.
    ///
    /// # Safety
    /// No other thread writes `[offset, offset + dst.len())` during the call.
    unsafe fn read(&self, offset: u64, dst: &mut [u8]) -> io::Result<()>;

    /// Commits what backs `[offset, offset + len)` ahead of use, where the device commits
    /// lazily (`ock.mmc.segment.prefault`). Must not change the contents. Default: nothing
    /// to do.
    fn prefault(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// The host mapping behind the device's memory, when it has one (an emulated device):
    /// the same-host data path copies between a client's memory and a blob there directly.
    /// Default: none (real device memory is not host-addressable).
    fn host_region(&self) -> Option<&MappedRegion> {
        None
    }

    /// The range is free: the device may release what backs it.
    ///
    /// # Safety
    /// The caller owns the range and will not read it before writing it again.
    unsafe fn discard(&self, offset: u64, len: u64);
}

/// Device memory emulated in host memory: a sparse mapping of a `memfd`
/// ([`MappedRegion::new_shared`]; anonymous memory where there are no memfds), committed page
/// by page on first write and returned to the kernel by `discard`. Its host mapping is where
/// same-host clients copy from (`http::same_host`), as for DRAM.
pub struct HostEmulated {
    region: MappedRegion,
}

impl HostEmulated {
    pub fn new(len: u64) -> io::Result<HostEmulated> {
        let region = MappedRegion::new_shared(len).or_else(|_| MappedRegion::new(len))?;
        Ok(HostEmulated { region })
    }
}

impl DeviceMemory for HostEmulated {
    fn name(&self) -> &str {
        "host-emulated"
    }

    fn capacity_bytes(&self) -> u64 {
        self.region.len()
    }

    unsafe fn write(&self, offset: u64, src: &[u8]) -> io::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.region.write(offset, src) }
    }

    unsafe fn read(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.region.read(offset, dst) }
    }

    unsafe fn discard(&self, offset: u64, len: u64) {
        // SAFETY: forwarded contract.
        unsafe { self.region.discard(offset, len) }
    }

    fn prefault(&self, offset: u64, len: u64) -> io::Result<()> {
        self.region.populate(offset, len)
    }

    fn host_region(&self) -> Option<&MappedRegion> {
        Some(&self.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_in_and_out_and_checks_bounds() {
        let dev = HostEmulated::new(1 << 20).unwrap();
        assert_eq!(dev.capacity_bytes(), 1 << 20);
        let data: Vec<u8> = (0..=255).collect();
        unsafe { dev.write(4000, &data).unwrap() };
        let mut back = vec![0u8; 256];
        unsafe { dev.read(4000, &mut back).unwrap() };
        assert_eq!(back, data);
        assert!(unsafe { dev.write((1 << 20) - 10, &data) }.is_err());
        assert!(unsafe { dev.read(u64::MAX - 1, &mut back) }.is_err());
        unsafe { dev.discard(0, 1 << 20) };
        unsafe { dev.read(4000, &mut back).unwrap() };
        assert!(
            back.iter().all(|&b| b == 0),
            "discarded pages read back as zeros"
        );
    }
}
