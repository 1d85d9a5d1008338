//! [`Backend`]: where a segment's bytes are, and the byte access every store path goes through.

use super::RemoteRank;
use super::remote_bytes;
use crate::accel::DeviceMemory;
use crate::common::memory::MappedRegion;
use crate::shards::store::ssd::SsdFile;

/// Where a segment's bytes are. The one interface between the store and bytes: host memory
/// (DRAM), accelerator memory (HBM, through `accel`), files (SSD); later memory of other hosts.
pub enum Backend {
    /// Memory in this process's address space: blobs can be sent without copying.
    Host(MappedRegion),
    /// Accelerator memory: copied in and out through the device interface.
    Device(Box<dyn DeviceMemory>),
    /// A file on a local disk, accessed asynchronously through the shard's io driver.
    File(Box<SsdFile>),
    /// Memory of a local service on another host (a remote rank): this process allocates
    /// its ranges and keeps its index, the bytes go between clients and that service under
    /// signed grants (`crate::grant`), never through here.
    Remote(RemoteRank),
}

impl Backend {
    /// Copies `src` into the segment at `offset` (memory backends only; files are written
    /// asynchronously by the SSD tier).
    ///
    /// # Safety
    /// The range belongs to one blob that the caller is writing (state ALLOCATED, or a blob
    /// being moved that no reader holds).
    pub unsafe fn write(&self, offset: u64, src: &[u8]) -> std::io::Result<()> {
        match self {
            // SAFETY: forwarded.
            Backend::Host(r) => unsafe { r.write(offset, src) },
            // SAFETY: forwarded.
            Backend::Device(d) => unsafe { d.write(offset, src) },
            Backend::File(_) => Err(std::io::Error::other(
                "file segments are written asynchronously",
            )),
            Backend::Remote(_) => Err(remote_bytes()),
        }
    }

    /// Copies the segment's bytes at `offset` into `dst` (memory backends only).
    ///
    /// # Safety
    /// The range belongs to a readable blob that the caller holds (pinned), so nobody writes it.
    pub unsafe fn read(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        match self {
            // SAFETY: forwarded.
            Backend::Host(r) => unsafe { r.read(offset, dst) },
            // SAFETY: forwarded.
            Backend::Device(d) => unsafe { d.read(offset, dst) },
            Backend::File(_) => Err(std::io::Error::other(
                "file segments are read asynchronously",
            )),
            Backend::Remote(_) => Err(remote_bytes()),
        }
    }

    /// Copies `len` bytes at `offset` into `to` at `to_offset` (memory backends only): straight
    /// into the destination when it is host memory, else through a buffer. An HBM blob's move
    /// down to DRAM, here or on a local service (`POST /cluster/v1/move`).
    ///
    /// Between two host mappings (DRAM, the emulated HBM tier) the copy's stores bypass the
    /// cache (`common::copy::memcpy`): the blob moving down is the tier's least recently used,
    /// nobody reads it soon, and a normal copy into memory out of cache reads every line it
    /// writes. In the default configuration every put into a full cache demotes about as many
    /// bytes as it stores: side by side, same-host 1 MiB puts took the server 605 µs of CPU
    /// against 684, 397 µs at the mean against 463 (perf/RESULTS.md, *Session 19*).
    ///
    /// # Safety
    /// The source range belongs to a readable blob nobody writes; the destination range was
    /// allocated for this copy and nobody else reads or writes it.
    pub unsafe fn copy_to(
        &self,
        offset: u64,
        to: &Backend,
        to_offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        if let (Some(src), Some(dst)) = (self.addressable(), to.host_region())
            && src.check(offset, len).is_ok()
            && dst.check(to_offset, len).is_ok()
        {
            // SAFETY: both ranges lie in their mappings (checked), the caller's word for the
            // rest; two blobs' ranges do not overlap.
            unsafe { crate::common::copy::memcpy(dst.ptr(to_offset), src.ptr(offset), len, true) };
            return Ok(());
        }
        match to.host_region() {
            Some(region) if region.check(to_offset, len).is_ok() => {
                // SAFETY: the caller's word for both ranges.
                let dst = unsafe { std::slice::from_raw_parts_mut(region.ptr(to_offset), len) };
                // SAFETY: as above.
                unsafe { self.read(offset, dst) }
            }
            _ => {
                let mut buf = vec![0u8; len];
                // SAFETY: as above.
                unsafe {
                    self.read(offset, &mut buf)
                        .and_then(|()| to.write(to_offset, &buf))
                }
            }
        }
    }

    /// Lets the backend release what backs a freed range.
    ///
    /// # Safety
    /// The range is free: no blob uses it.
    pub unsafe fn discard(&self, offset: u64, len: u64) {
        match self {
            // SAFETY: forwarded.
            Backend::Host(r) => unsafe { r.discard(offset, len) },
            // SAFETY: forwarded.
            Backend::Device(d) => unsafe { d.discard(offset, len) },
            Backend::File(_) | Backend::Remote(_) => {}
        }
    }

    /// Commits the memory behind a range ahead of its first write (files: nothing to do).
    pub fn prefault(&self, offset: u64, len: u64) -> std::io::Result<()> {
        match self {
            Backend::Host(r) => r.populate(offset, len),
            Backend::Device(d) => d.prefault(offset, len),
            Backend::File(_) | Backend::Remote(_) => Ok(()),
        }
    }

    pub fn host_region(&self) -> Option<&MappedRegion> {
        match self {
            Backend::Host(r) => Some(r),
            _ => None,
        }
    }

    /// The host mapping of host memory, or of device memory that has one (an emulated
    /// device, `DeviceMemory::host_region`): where the same-host data path copies directly.
    pub fn addressable(&self) -> Option<&MappedRegion> {
        match self {
            Backend::Host(r) => Some(r),
            Backend::Device(d) => d.host_region(),
            _ => None,
        }
    }

    /// The local service holding a remote rank's bytes.
    pub fn remote(&self) -> Option<&RemoteRank> {
        match self {
            Backend::Remote(r) => Some(r),
            _ => None,
        }
    }

    pub fn file(&self) -> Option<&SsdFile> {
        match self {
            Backend::File(f) => Some(f),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::memory::MappedRegion;

    #[test]
    fn a_move_between_host_mappings_copies_every_byte_and_nothing_around_them() {
        // An emulated HBM tier's blob moving down to DRAM.
        let from = Backend::Device(Box::new(
            crate::accel::HostEmulated::new(1 << 20).expect("device"),
        ));
        let to = Backend::Host(MappedRegion::new(1 << 20).expect("region"));
        let pattern: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 % 251) as u8).collect();
        // SAFETY: the regions are this test's; nothing else reads or writes them.
        unsafe {
            from.write(0, &pattern).expect("write");
            to.write(0, &vec![0xee; 1 << 20]).expect("write");
        }
        // Streamed (a blob of 64 KiB and more), short, and at offsets in no page's start.
        for (src_at, dst_at, len) in [
            (0, 64, 256 << 10),
            (4096, 300_000, 70_001),
            (13, 700_001, 5000),
        ] {
            // SAFETY: as above; the ranges lie in the regions.
            unsafe { from.copy_to(src_at, &to, dst_at, len).expect("copy") };
            let mut got = vec![0u8; len + 2];
            // SAFETY: as above.
            unsafe { to.read(dst_at - 1, &mut got).expect("read") };
            assert_eq!(got[0], 0xee);
            assert!(got[1..=len] == pattern[src_at as usize..src_at as usize + len]);
            assert_eq!(got[len + 1], 0xee);
        }
        // A range past the destination's end is refused, not copied.
        // SAFETY: as above.
        assert!(unsafe { from.copy_to(0, &to, (1 << 20) - 100, 4096) }.is_err());
    }
}
