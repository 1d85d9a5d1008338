//! The front ring's provided buffer ring: `COUNT` buffers of `SIZE` bytes the kernel picks
//! from for every multishot receive, and the ring of their descriptors. A buffer's bytes are
//! copied to its connection as soon as its completion is reaped, and the buffer goes back at
//! once; all buffers given back in a pass become visible to the kernel with one tail store.

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{IoUring, types};

/// Buffers in the ring (a power of two).
pub const COUNT: u16 = 512;
/// Bytes per buffer: a receive completes with at most this much.
pub const SIZE: u32 = 8 * 1024;
/// The buffer group id of the front ring's receives.
pub const GROUP: u16 = 1;

pub struct BufRing {
    ring: *mut types::BufRingEntry,
    bufs: *mut u8,
    /// Our tail: entries up to it are written; the kernel sees them once published.
    tail: u16,
    published: u16,
}

fn map(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh anonymous private mapping, no file, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

fn entries_len() -> usize {
    COUNT as usize * std::mem::size_of::<types::BufRingEntry>()
}

fn bufs_len() -> usize {
    COUNT as usize * SIZE as usize
}

impl BufRing {
    /// Maps the buffers and registers them with `ring` (`IORING_REGISTER_PBUF_RING`, 5.19;
    /// an older kernel refuses it).
    pub fn new(ring: &IoUring) -> io::Result<BufRing> {
        let entries = map(entries_len())?;
        let bufs = match map(bufs_len()) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the mapping was just made, with this length.
                unsafe { libc::munmap(entries.cast(), entries_len()) };
                return Err(e);
            }
        };
        let mut br = BufRing {
            ring: entries.cast(),
            bufs,
            tail: 0,
            published: 0,
        };
        // SAFETY: the entries are page aligned, `COUNT` long, and stay mapped until the
        // BufRing is dropped, after the ring (the ring's owner declares it first).
        unsafe {
            ring.submitter()
                .register_buf_ring(entries as u64, COUNT, GROUP)?
        };
        for bid in 0..COUNT {
            br.give(bid);
        }
        br.publish();
        Ok(br)
    }

    /// Puts buffer `bid` at our tail (the kernel sees it at the next `publish`).
    pub fn give(&mut self, bid: u16) {
        debug_assert!(bid < COUNT);
        let slot = (self.tail & (COUNT - 1)) as usize;
        // SAFETY: slot < COUNT; the kernel does not read entries past the published tail.
        let e = unsafe { &mut *self.ring.add(slot) };
        e.set_addr(self.bufs as u64 + bid as u64 * SIZE as u64);
        e.set_len(SIZE);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the given buffers visible to the kernel: one release store of the tail.
    pub fn publish(&mut self) {
        if self.published == self.tail {
            return;
        }
        // SAFETY: the tail field overlays the first entry's reserved half-word, u16 aligned.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.ring) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
        self.published = self.tail;
    }

    /// The `len` bytes the kernel wrote into buffer `bid`.
    pub fn data(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < COUNT && len <= SIZE as usize);
        // SAFETY: the kernel wrote `len` bytes into buffer `bid` and handed it to us; it is
        // not given back before this borrow ends.
        unsafe { std::slice::from_raw_parts(self.bufs.add(bid as usize * SIZE as usize), len) }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: both mappings were made by `new` with these lengths; the ring that used
        // them is gone (dropped first).
        unsafe {
            libc::munmap(self.ring.cast(), entries_len());
            libc::munmap(self.bufs.cast(), bufs_len());
        }
    }
}
