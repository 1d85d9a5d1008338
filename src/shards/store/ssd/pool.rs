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

fn pwrite_all(fd: RawFd, data: &[u8], offset: u64) -> io::Result<()> {
    let len = data.len();
    let at_zero = (io::ErrorKind::WriteZero, "pwrite wrote nothing");
    positioned(len, offset, at_zero, |done, at| {
        // SAFETY: `data[done..]` is a valid slice; fd stays open while its segment lives.
        unsafe { libc::pwrite(fd, data[done..].as_ptr().cast(), len - done, at) }
    })
}

fn pread_exact(fd: RawFd, dst: &mut [u8], offset: u64) -> io::Result<()> {
    let (len, ptr) = (dst.len(), dst.as_mut_ptr());
    let at_zero = (io::ErrorKind::UnexpectedEof, "short read from SSD file");
    positioned(len, offset, at_zero, |done, at| {
        // SAFETY: `ptr + done .. ptr + len` lies in `dst`, a valid writable slice.
        unsafe { libc::pread(fd, ptr.add(done).cast(), len - done, at) }
    })
}

/// Repeats a positioned read or write of `len` bytes at `offset` until all are done:
/// `io(done, at)` transfers from byte `done` on, at file offset `at`, and returns what the
/// syscall returned (retried when interrupted). A transfer of 0 bytes is the error `at_zero`.
fn positioned(
    len: usize,
    offset: u64,
    at_zero: (io::ErrorKind, &'static str),
    mut io: impl FnMut(usize, libc::off_t) -> isize,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = io(done, (offset + done as u64) as libc::off_t);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(at_zero.0, at_zero.1));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn positioned_io_round_trips_and_a_read_past_the_end_is_short() {
        let path = std::env::temp_dir().join(format!("mmc-ssd-pool-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let fd = file.as_raw_fd();
        let data: Vec<u8> = (0..=255).cycle().take(100_000).collect();
        pwrite_all(fd, &data, 4096).unwrap();
        let mut back = vec![0u8; data.len()];
        pread_exact(fd, &mut back, 4096).unwrap();
        assert_eq!(back, data);
        let mut past = [0u8; 16];
        let e = pread_exact(fd, &mut past, 4096 + data.len() as u64 - 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(past[..8], data[data.len() - 8..]);
        let _ = std::fs::remove_file(&path);
    }
}
