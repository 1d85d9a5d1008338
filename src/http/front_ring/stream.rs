//! [`RingStream`]: a front-ring connection as monoio's `AsyncReadRent + AsyncWriteRent`, so
//! the connection code serves it as it serves a monoio `TcpStream`.
//!
//! A read copies what the pump received for the connection, or waits for the pump's wake; a
//! read into one buffer that waits has the pump copy what arrives straight into it, and a read
//! of `DIRECT_BYTES` or more with nothing pending is received in place by a one-shot `RECV`
//! (the multishot receive cancelled until a small read arms it again).
//! A write appends to the connection's output, which the pump sends at its next pass; it
//! completes when queued, and waits while `WRITE_LIMIT` bytes are unsent (the back-pressure).
//! A large write (`DIRECT_BYTES`) is sent from the caller's buffer instead, after what was
//! queued before it, and completes with its send.
//! `flush` waits until everything written has left (`conn::linger` flushes before it shuts
//! the socket's write side down). Dropping the stream sends what is queued, then closes.

use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::{Context, Poll};

use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::conns::{Conn, Dst, RX_PAUSE_BYTES, Recv};
use super::{FrontRing, Inner};
use crate::limits::WRITE_BUF_FLUSH_BYTES;

/// Unsent bytes past which a write waits for the pump's sends.
const WRITE_LIMIT: usize = WRITE_BUF_FLUSH_BYTES;

/// Writes of at least this many bytes leave from the caller's buffer in one `SENDMSG` (a
/// large answer's head and blobs), instead of being copied into the connection's output in
/// `WRITE_LIMIT` pieces: one copy fewer, and one send where there were many.
const DIRECT_BYTES: usize = 64 * 1024;

/// A drained `rx` keeps its allocation up to this size (a larger one is freed, for idle
/// connections' memory); kept, the next request's bytes need no fresh pages.
const RX_KEEP_BYTES: usize = 1024 * 1024;

fn broken(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

/// One connection of a shard's front ring.
pub struct RingStream {
    ring: Rc<FrontRing>,
    key: usize,
    fd: RawFd,
}

impl RingStream {
    pub(super) fn new(ring: Rc<FrontRing>, key: usize) -> RingStream {
        let fd = ring.inner.borrow().conns[key].fd;
        RingStream { ring, key, fd }
    }

    /// The connection's socket (the housekeeping tick shuts it down).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner, usize) -> R) -> R {
        f(&mut self.ring.inner.borrow_mut(), self.key)
    }

    /// Copies up to `len` received bytes to `dst`; `Pending` (the waker kept) when there are
    /// none yet.
    /// `into`: `dst` is one buffer, which the pump may fill while this read waits
    /// (`Conn::dst`; a [`ReadInto`] guards it).
    fn poll_read(
        &self,
        cx: &mut Context<'_>,
        dst: &mut [IoSlice],
        into: bool,
    ) -> Poll<std::io::Result<usize>> {
        let (ready, kick) = self.with(|inner, key| {
            let c = &mut inner.conns[key];
            if let Some(d) = c.dst.take_if(|d| d.filled > 0) {
                // The pump copied them there, from the buffer's start.
                return (Poll::Ready(Ok(d.filled)), false);
            }
            if c.unread() == 0 {
                if let Some(e) = c.error {
                    return (Poll::Ready(Err(broken(e))), false);
                }
                if c.eof {
                    return (Poll::Ready(Ok(0)), false);
                }
                if !c.reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    c.reader = Some(cx.waker().clone());
                }
                if into && c.dst.is_none() {
                    c.dst = Some(Dst {
                        ptr: dst[0].ptr,
                        len: dst[0].len,
                        filled: 0,
                    });
                }
                // Nothing unread: a small read arms the multishot receive again (after reads
                // received in place, or a pause for a full `rx`).
                c.paused = false;
                c.want_direct = false;
                if c.recv == Recv::Idle {
                    inner.rearm.push(key);
                    return (Poll::Pending, true);
                }
                return (Poll::Pending, false);
            }
            c.dst = None;
            let n = copy_out(c, dst);
            let mut kick = false;
            if c.paused && c.unread() < RX_PAUSE_BYTES / 2 {
                c.paused = false;
                inner.rearm.push(key);
                kick = true;
            }
            (Poll::Ready(Ok(n)), kick)
        });
        if kick {
            self.ring.kick();
        }
        ready
    }

    /// Queues as much of `src` as fits under `WRITE_LIMIT`; `Pending` while the output is full.
    fn poll_write(&self, cx: &mut Context<'_>, src: &[IoSlice]) -> Poll<std::io::Result<usize>> {
        let ready = self.with(|inner, key| {
            let c = &mut inner.conns[key];
            if let Some(e) = c.error {
                return Poll::Ready(Err(broken(e)));
            }
            let room = WRITE_LIMIT.saturating_sub(c.out.len());
            if room == 0 {
                c.writer = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let mut n = 0;
            for s in src {
                let take = s.len.min(room - n);
                // SAFETY: the caller's buffer is valid for `len` bytes while it is borrowed.
                c.out
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(s.ptr, take) });
                n += take;
                if n == room {
                    break;
                }
            }
            if n > 0 && !c.queued {
                c.queued = true;
                inner.dirty.push(key);
            }
            Poll::Ready(Ok(n))
        });
        self.ring.kick();
        ready
    }

    /// Ready once everything written has been sent (or the connection broke).
    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.with(|inner, key| {
            let c = &mut inner.conns[key];
            if let Some(e) = c.error {
                return Poll::Ready(Err(broken(e)));
            }
            if c.out.is_empty() && !c.in_flight {
                return Poll::Ready(Ok(()));
            }
            c.writer = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}

impl RingStream {
    /// Sends `iov`, which points into `buf`, straight from there: after what was written
    /// before has left, with one `SENDMSG` whose result is the write's. `buf` outlives the
    /// send even if this future is dropped first ([`DirectWrite`]).
    async fn write_direct<T: 'static>(
        &mut self,
        buf: T,
        iov: Vec<libc::iovec>,
    ) -> BufResult<usize, T> {
        self.ring.kick();
        if let Err(e) = std::future::poll_fn(|cx| self.poll_flush(cx)).await {
            return (Err(e), buf);
        }
        let mut w = DirectWrite {
            stream: self,
            buf: Some(buf),
        };
        w.stream.with(|inner, key| inner.start_direct(key, iov));
        w.stream.ring.kick();
        let r = std::future::poll_fn(|cx| w.poll_done(cx)).await;
        (r, w.buf.take().expect("held until the send is done"))
    }
}

/// A direct send's caller buffer while the kernel may read it: dropped before the send
/// completed (the connection's task ended), it hands the buffer to the connection, which
/// frees it when the completion arrives.
struct DirectWrite<'a, T: 'static> {
    stream: &'a RingStream,
    buf: Option<T>,
}

impl<T: 'static> DirectWrite<'_, T> {
    fn poll_done(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        self.stream.with(|inner, key| {
            let c = &mut inner.conns[key];
            match c.direct.as_ref().and_then(|d| d.done) {
                Some(res) => {
                    c.direct = None;
                    Poll::Ready(if res < 0 {
                        Err(broken(-res))
                    } else {
                        Ok(res as usize)
                    })
                }
                None => {
                    c.writer = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
    }
}

impl<T: 'static> Drop for DirectWrite<'_, T> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else {
            return;
        };
        self.stream.with(|inner, key| {
            let c = &mut inner.conns[key];
            match c.direct.as_mut() {
                Some(d) if d.done.is_none() => d.keep = Some(Box::new(buf)),
                _ => c.direct = None,
            }
        });
    }
}

fn libc_iovecs(src: &[IoSlice]) -> Vec<libc::iovec> {
    src.iter()
        .map(|s| libc::iovec {
            iov_base: s.ptr.cast(),
            iov_len: s.len,
        })
        .collect()
}

/// A part of a caller's buffer: where, and how many bytes.
#[derive(Clone, Copy)]
struct IoSlice {
    ptr: *mut u8,
    len: usize,
}

fn copy_out(c: &mut Conn, dst: &mut [IoSlice]) -> usize {
    let mut n = 0;
    for d in dst.iter() {
        let take = d.len.min(c.unread());
        // SAFETY: `d` is the caller's writable buffer of at least `len` bytes; the source is
        // our own vector; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(c.rx.as_ptr().add(c.rx_at), d.ptr, take) };
        c.rx_at += take;
        n += take;
        if c.unread() == 0 {
            break;
        }
    }
    if c.unread() == 0 {
        c.rx.clear();
        c.rx_at = 0;
        if c.rx.capacity() > RX_KEEP_BYTES {
            c.rx = Vec::new();
        }
    }
    n
}

fn iovecs(ptr: *const libc::iovec, len: usize) -> Vec<IoSlice> {
    // SAFETY: the buffer promises `len` valid iovecs at `ptr` while it is borrowed.
    let iov = unsafe { std::slice::from_raw_parts(ptr, len) };
    iov.iter()
        .map(|v| IoSlice {
            ptr: v.iov_base.cast(),
            len: v.iov_len,
        })
        .collect()
}

/// A read whose buffer the pump may fill (`Conn::dst`): dropped while it waits, it takes the
/// buffer back, and bytes already copied there go back to the front of the connection's
/// received bytes (the buffer is still alive here: it is dropped after this guard).
struct ReadInto<'a>(&'a RingStream);

impl Drop for ReadInto<'_> {
    fn drop(&mut self) {
        self.0.with(|inner, key| {
            let c = &mut inner.conns[key];
            if let Some(d) = c.dst.take().filter(|d| d.filled > 0) {
                // SAFETY: the caller's buffer is alive until after this guard, and the pump
                // wrote `filled` bytes at its start.
                let got = unsafe { std::slice::from_raw_parts(d.ptr, d.filled) };
                c.unread_first(got);
            }
        });
    }
}

/// A read of `DIRECT_BYTES` or more, received in place: the connection's multishot receive is
/// cancelled and the kernel writes into the reader's buffer with one `RECV` (what was received
/// before is copied first). Dropped while that receive is in flight, the guard hands the buffer
/// to the connection and cancels the receive; what still lands in the buffer goes to the
/// connection's received bytes (`Inner::received_direct`).
struct DirectReadGuard<'a, T: 'static> {
    stream: &'a RingStream,
    buf: Option<T>,
    /// A receive of ours is in flight or completed and not yet collected.
    started: bool,
}

enum Then {
    Wait,
    Cancel,
    Start,
}

impl<T: 'static> DirectReadGuard<'_, T> {
    fn poll(&mut self, cx: &mut Context<'_>, at: IoSlice) -> Poll<std::io::Result<usize>> {
        let started = &mut self.started;
        let fd = self.stream.fd;
        let (ready, kick) = self.stream.with(|inner, key| {
            let c = &mut inner.conns[key];
            if let Some(d) = c.rdirect.as_ref() {
                match d.done {
                    // Ours in flight, or a dropped read's: its completion wakes us.
                    None => {
                        c.reader = Some(cx.waker().clone());
                        return (Poll::Pending, false);
                    }
                    Some(res) => {
                        c.rdirect = None;
                        *started = false;
                        if res >= 0 {
                            return (Poll::Ready(Ok(res as usize)), false);
                        }
                        if res != -libc::ECANCELED {
                            return (Poll::Ready(Err(broken(-res))), false);
                        }
                    }
                }
            }
            if c.unread() > 0 {
                c.dst = None;
                let n = copy_out(c, &mut [at]);
                // As `poll_read`: a receive paused for a full `rx` resumes once it drained
                // (unless this read goes on in place: `want_direct` keeps it off).
                if c.paused && c.unread() < RX_PAUSE_BYTES / 2 {
                    c.paused = false;
                    inner.rearm.push(key);
                    return (Poll::Ready(Ok(n)), true);
                }
                return (Poll::Ready(Ok(n)), false);
            }
            if let Some(e) = c.error {
                return (Poll::Ready(Err(broken(e))), false);
            }
            if c.eof {
                return (Poll::Ready(Ok(0)), false);
            }
            c.reader = Some(cx.waker().clone());
            c.want_direct = true;
            let then = match c.recv {
                Recv::Armed => Then::Cancel,
                Recv::Idle => Then::Start,
                Recv::Cancelling | Recv::Direct => Then::Wait,
            };
            match then {
                Then::Wait => (Poll::Pending, false),
                Then::Cancel => {
                    inner.cancel_recv(key);
                    (Poll::Pending, true)
                }
                Then::Start => {
                    // Nothing of the ring's is receiving on the socket: what it holds already
                    // is taken at once with one `recv` (a body streaming in, as the epoll
                    // driver reads it), without a pass of the pump and a wake per piece; the
                    // ring's `RECV` waits only when the socket is empty.
                    // SAFETY: `at` is the reader's buffer, alive and writable for `at.len`
                    // bytes; `fd` is open while the stream lives.
                    // (`want_direct` stays set, as after a receive in place: the multishot
                    // receive is armed again by the next small read.)
                    let n = unsafe { libc::recv(fd, at.ptr.cast(), at.len, libc::MSG_DONTWAIT) };
                    if n >= 0 {
                        c.reader = None;
                        if n == 0 {
                            c.eof = true;
                        }
                        return (Poll::Ready(Ok(n as usize)), false);
                    }
                    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    if errno != libc::EAGAIN && errno != libc::EINTR {
                        c.reader = None;
                        c.error = Some(errno);
                        c.wake_writer();
                        return (Poll::Ready(Err(broken(errno))), false);
                    }
                    inner.start_direct_recv(key, at.ptr, at.len);
                    *started = true;
                    (Poll::Pending, true)
                }
            }
        });
        if kick {
            self.stream.ring.kick();
        }
        ready
    }
}

impl<T: 'static> Drop for DirectReadGuard<'_, T> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take().filter(|_| self.started) else {
            return;
        };
        self.stream.with(|inner, key| {
            let c = &mut inner.conns[key];
            let Some(d) = c.rdirect.as_mut() else {
                return;
            };
            match d.done {
                None => {
                    d.keep = Some(Box::new(buf));
                    inner.cancel_recv(key);
                }
                Some(res) => {
                    // Completed, not collected: its bytes are the stream's next ones.
                    if res > 0 {
                        // SAFETY: the kernel wrote `res` bytes at `ptr`, in `buf` (alive here).
                        let got = unsafe { std::slice::from_raw_parts(d.ptr, res as usize) };
                        c.unread_first(got);
                    }
                    c.rdirect = None;
                }
            }
        });
        self.stream.ring.kick();
    }
}

impl RingStream {
    async fn read_direct<T: IoBufMut>(&mut self, buf: T, at: IoSlice) -> BufResult<usize, T> {
        let mut guard = DirectReadGuard {
            stream: self,
            buf: Some(buf),
            started: false,
        };
        let r = std::future::poll_fn(|cx| guard.poll(cx, at)).await;
        let mut buf = guard.buf.take().expect("held until the read is over");
        if let Ok(n) = r {
            // SAFETY: `n` bytes were written from the buffer's start (by the kernel or by
            // `copy_out`).
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    }
}

impl AsyncReadRent for RingStream {
    async fn read<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        // As monoio's own read: from the buffer's start, up to its total size.
        let mut dst = [IoSlice {
            ptr: buf.write_ptr(),
            len: buf.bytes_total(),
        }];
        let large = dst[0].len >= DIRECT_BYTES;
        let bulk = self.with(|inner, key| {
            let c = &mut inner.conns[key];
            if large {
                c.bulk = true;
            } else if c.small_before {
                c.bulk = false;
            }
            c.small_before = !large;
            c.bulk
        });
        if large || (bulk && dst[0].len > 0) {
            return self.read_direct(buf, dst[0]).await;
        }
        let into = dst[0].len > 0;
        let guard = ReadInto(self);
        let r = std::future::poll_fn(|cx| guard.0.poll_read(cx, &mut dst, into)).await;
        drop(guard);
        if let Ok(n) = r {
            // SAFETY: `copy_out` wrote `n` bytes from the buffer's start.
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        let mut dst = iovecs(buf.write_iovec_ptr(), buf.write_iovec_len());
        let r = std::future::poll_fn(|cx| self.poll_read(cx, &mut dst, false)).await;
        if let Ok(n) = r {
            // SAFETY: `n` bytes were written from the start of the iovecs.
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    }
}

impl AsyncWriteRent for RingStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let src = [IoSlice {
            ptr: buf.read_ptr() as *mut u8,
            len: buf.bytes_init(),
        }];
        if src[0].len >= DIRECT_BYTES {
            // SAFETY (of the send): an IoBuf's bytes stay where they are while it lives, also
            // when it is moved (monoio's own driver relies on the same).
            return self.write_direct(buf, libc_iovecs(&src)).await;
        }
        let r = std::future::poll_fn(|cx| self.poll_write(cx, &src)).await;
        (r, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let src = iovecs(buf.read_iovec_ptr(), buf.read_iovec_len());
        if src.iter().map(|s| s.len).sum::<usize>() >= DIRECT_BYTES {
            return self.write_direct(buf, libc_iovecs(&src)).await;
        }
        let r = std::future::poll_fn(|cx| self.poll_write(cx, &src)).await;
        (r, buf)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        self.ring.kick();
        std::future::poll_fn(|cx| self.poll_flush(cx)).await
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.flush().await?;
        // SAFETY: the descriptor is open until this stream is dropped.
        if unsafe { libc::shutdown(self.fd, libc::SHUT_WR) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for RingStream {
    fn drop(&mut self) {
        {
            let mut inner = self.ring.inner.borrow_mut();
            let c = &mut inner.conns[self.key];
            c.dropped = true;
            c.reader = None;
            c.dst = None;
            c.writer = None;
            inner.closing.push(self.key);
        }
        self.ring.kick();
    }
}
