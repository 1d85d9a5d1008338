//! The SSD I/O threads of the epoll driver (which has no asynchronous file I/O): a bounded
//! queue of jobs ([`IO_QUEUE_CAPACITY`]) served by two threads doing positioned reads and
//! writes, each job answered on its own channel.

use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;

use super::{IoBuffer, IoOp};

pub(super) struct Job {
    pub(super) fd: RawFd,
    pub(super) op: IoOp,
    pub(super) offset: u64,
    pub(super) buf: IoBuffer,
    pub(super) done: flume::Sender<(io::Result<()>, IoBuffer)>,
}

/// Jobs the I/O pool's queue holds. A shard task that finds it full awaits room
/// (`send_async`): the task waits, the shard thread keeps serving, and no job is lost; the
/// waiting tasks are bounded by the shard's requests and flushes in flight.
pub const IO_QUEUE_CAPACITY: usize = 256;

/// Threads that run file I/O for shards on the epoll driver (which has no asynchronous file
/// I/O). Two threads: SSD operations are large and few; more would only contend.
pub(super) fn pool() -> &'static flume::Sender<Job> {
    static POOL: OnceLock<flume::Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = flume::bounded::<Job>(IO_QUEUE_CAPACITY);
        for i in 0..2 {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("mmc-ssd-io-{i}"))
                .spawn(move || {
                    while let Ok(mut job) = rx.recv() {
                        let res = match job.op {
                            IoOp::Write => pwrite_all(job.fd, job.buf.as_slice(), job.offset),
                            IoOp::Probe => {
                                let len = job.buf.len();
                                pwrite_all(job.fd, job.buf.as_slice(), job.offset).map(|()| {
                                    // Give the page back (best effort: not every file system
                                    // punches holes).
                                    // SAFETY: a plain syscall on an open descriptor.
                                    unsafe {
                                        libc::fallocate(
                                            job.fd,
                                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                                            job.offset as libc::off_t,
                                            len as libc::off_t,
                                        )
                                    };
                                })
                            }
                            IoOp::Read => {
                                let cap = job.buf.cap;
                                // SAFETY: the buffer owns `cap` writable bytes at `ptr`.
                                let dst =
                                    unsafe { std::slice::from_raw_parts_mut(job.buf.ptr, cap) };
                                let r = pread_exact(job.fd, dst, job.offset);
                                if r.is_ok() {
                                    job.buf.init = cap;
                                }
                                r
                            }
                        };
                        let _ = job.done.send((res, job.buf));
                    }
                })
                .expect("cannot start an SSD I/O thread");
        }
        tx
    })
}

fn pwrite_all(fd: RawFd, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: data is a valid slice; fd stays open while its segment lives.
        let n =
            unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwrite wrote nothing",
            ));
        }
        data = &data[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

fn pread_exact(fd: RawFd, mut dst: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !dst.is_empty() {
        // SAFETY: dst is a valid writable slice.
        let n = unsafe {
            libc::pread(
                fd,
                dst.as_mut_ptr().cast(),
                dst.len(),
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short read from SSD file",
            ));
        }
        let n = n as usize;
        dst = &mut dst[n..];
        offset += n as u64;
    }
    Ok(())
}
