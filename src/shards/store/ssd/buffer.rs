//! [`IoBuffer`]: the buffer of an SSD file operation, owned or a view into a segment's host
//! memory.

use std::io;
use std::sync::Arc;

use super::super::segment::SegRef;

/// A buffer for file I/O that is either owned or a view into a segment's host memory (so a
/// DRAM blob is flushed and rewarmed without an extra copy). Moves between threads with its
/// owner, as the ring and the I/O pool need.
pub struct IoBuffer {
    pub(super) ptr: *mut u8,
    pub(super) cap: usize,
    pub(super) init: usize,
    _owner: Owner,
}

enum Owner {
    Vec(#[allow(dead_code)] Vec<u8>),
    Segment(#[allow(dead_code)] Arc<SegRef>),
}

// SAFETY: the pointer is into memory the buffer keeps alive (its Vec or its segment's mapping).
unsafe impl Send for IoBuffer {}

impl IoBuffer {
    /// An owned buffer of `len` bytes to read into, or holding `data` to write.
    pub fn owned(mut data: Vec<u8>, init: bool) -> IoBuffer {
        let cap = if init { data.len() } else { data.capacity() };
        let init_len = if init { data.len() } else { 0 };
        let ptr = data.as_mut_ptr();
        IoBuffer {
            ptr,
            cap,
            init: init_len,
            _owner: Owner::Vec(data),
        }
    }

    /// A view of `[offset, offset + len)` of a host-memory segment.
    ///
    /// # Safety
    /// The range belongs to a blob the caller keeps pinned (for writes to the file) or owns
    /// (ALLOCATED, for reads from the file) until the I/O completes.
    pub unsafe fn segment_view(
        seg: Arc<SegRef>,
        offset: u64,
        len: usize,
        init: bool,
    ) -> io::Result<IoBuffer> {
        let region = seg
            .backend
            .host_region()
            .ok_or_else(|| io::Error::other("not a host-memory segment"))?;
        region.check(offset, len)?;
        let ptr = region.ptr(offset);
        Ok(IoBuffer {
            ptr,
            cap: len,
            init: if init { len } else { 0 },
            _owner: Owner::Segment(seg),
        })
    }

    pub fn len(&self) -> usize {
        self.init
    }

    pub fn is_empty(&self) -> bool {
        self.init == 0
    }

    /// The bytes read (owned buffers).
    pub fn into_vec(self) -> Vec<u8> {
        match self._owner {
            Owner::Vec(mut v) => {
                // SAFETY: `init` bytes were written by the read.
                unsafe { v.set_len(self.init) };
                v
            }
            Owner::Segment(_) => Vec::new(),
        }
    }

    /// The initialized bytes (what was read, or what is to be written).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `init` bytes from `ptr` are initialized and alive (see the owner).
        unsafe { std::slice::from_raw_parts(self.ptr, self.init) }
    }
}

// SAFETY: ptr/cap/init describe memory owned by the buffer.
unsafe impl monoio::buf::IoBuf for IoBuffer {
    fn read_ptr(&self) -> *const u8 {
        self.ptr
    }

    fn bytes_init(&self) -> usize {
        self.init
    }
}

// SAFETY: as above; `set_init` never exceeds `cap` (monoio guarantees it).
unsafe impl monoio::buf::IoBufMut for IoBuffer {
    fn write_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    fn bytes_total(&mut self) -> usize {
        self.cap
    }

    unsafe fn set_init(&mut self, pos: usize) {
        self.init = pos.min(self.cap);
    }
}
