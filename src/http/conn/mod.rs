//! One connection: read, frame requests, dispatch, write answers in order. The connection
//! loop is here; `framing.rs` finds requests in the read buffer, `dispatch.rs` answers one
//! (`answer`), `body_io.rs` moves bodies between the socket and blobs.
//!
//! Requests are answered strictly in arrival order (pipelining), with all complete requests
//! in a read processed before one write of their answers. Bodies are framed by
//! `Content-Length` or decoded from chunked encoding in place, in the read buffer. A body over
//! its limit is answered 413 as soon as the head shows it, without reading the body.

mod body_io;
mod dispatch;
mod framing;
mod same_host;

use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::handlers::Ctx;
use super::parse::{Parsed, parse_head};
use super::same_host::LocalPeer;
use super::{ConnGuard, ConnState, Front};
use crate::limits::{
    LINGER_DISCARD_BYTES, LINGER_MS, READ_BUF_INITIAL_BYTES, READ_BUF_KEEP_BYTES,
    WRITE_BUF_FLUSH_BYTES,
};
use body_io::stream_put;
use dispatch::{answer, answer_malformed};
use framing::{Framed, Pending, complete_request, frame, verdict, wants_continue};

/// A connection's byte stream: plain TCP or TLS over it.
pub trait Io: AsyncReadRent + AsyncWriteRent {}

impl<T: AsyncReadRent + AsyncWriteRent> Io for T {}

/// A connection's buffers and framing state, carried between reads.
struct Bufs {
    /// The plain socket under the stream (no TLS), which answers may be written to directly.
    direct: Option<RawFd>,
    /// The process at the other end of a same-host (Unix socket) connection.
    peer: Option<LocalPeer>,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    scratch: Vec<u8>,
    pending: Pending,
    /// When the body of the request being framed started to arrive over several reads (its
    /// receiving counts in a put's transfer time).
    body_since: Option<Instant>,
    continue_sent: bool,
}

/// Serves one connection. `fd` is the socket under `stream` (the housekeeping tick shuts it
/// down to end idle or stalled connections); `plain` when `stream` is the socket itself (no
/// TLS), so answers may be written to `fd` directly. `peer`: the client process of a
/// same-host connection (`http::same_host`), whose memory its requests may name.
pub async fn run<S: Io>(
    front: Rc<Front>,
    mut stream: S,
    fd: RawFd,
    plain: bool,
    peer: Option<LocalPeer>,
) {
    let direct = plain.then_some(fd);
    let conn = front.register(fd);
    let mut b = Bufs {
        direct,
        peer,
        rbuf: Vec::with_capacity(READ_BUF_INITIAL_BYTES),
        // Grown by the first answer to its size (a few hundred bytes for most), not 4 KiB
        // up front for every connection.
        wbuf: Vec::new(),
        scratch: Vec::new(),
        pending: Pending::None,
        body_since: None,
        continue_sent: false,
    };
    let mut charge = BufferCharge {
        front: &front,
        bytes: 0,
    };
    loop {
        let Some((start, close)) = answer_buffered(&front, &conn, &mut stream, &mut b).await else {
            return;
        };
        if start > 0 {
            b.rbuf.drain(..start);
        }
        // Closing: the last answer and the FIN `linger` sends go out as one segment (held
        // back by MSG_MORE on a direct write, else by the socket's cork).
        if close && direct.is_none() {
            cork(fd);
        }
        if !b.wbuf.is_empty() && !flush_answers(&mut stream, direct, close, &mut b.wbuf).await {
            return;
        }
        if close {
            if direct.is_some() && b.rbuf.is_empty() {
                // Nothing unread: the buffers go now, and the client's end is awaited at
                // housekeeping ticks (no wake-up for it).
                drop(b);
                charge.settle(0);
                linger_at_ticks(&front, &mut stream, fd).await;
            } else {
                linger(&mut stream, fd, b.rbuf).await;
            }
            return;
        }
        if front.is_draining() && b.rbuf.is_empty() {
            return;
        }
        // The client waits for our go-ahead before sending a body it announced.
        if !b.continue_sent && wants_continue(&b.pending) {
            b.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !flush_answers(&mut stream, direct, false, &mut b.wbuf).await {
                return;
            }
            b.continue_sent = true;
        }
        if b.rbuf.is_empty() {
            conn.set(ConnState::Idle);
            if b.rbuf.capacity() > READ_BUF_KEEP_BYTES {
                b.rbuf = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
                charge.settle(b.rbuf.capacity());
            }
        } else {
            conn.set(ConnState::Reading);
        }
        if !make_room(&front, &mut charge, &mut stream, fd, &mut b).await {
            return;
        }
        let len = b.rbuf.len();
        if b.peer.is_some() && b.rbuf.is_empty() {
            match spin_for_next(&front, fd, &mut b.rbuf).await {
                Some(0) => return,
                Some(_) => continue,
                None => {}
            }
        }
        let (res, slice) = stream
            .read(std::mem::take(&mut b.rbuf).slice_mut(len..))
            .await;
        b.rbuf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Polls `fd` without blocking, yielding to the shard's other tasks (and the CPU to other
/// threads) between polls, for up to `ock.mmc.http.same_host_spin_us`: a same-host client
/// sending requests one after another (a loop of gets) finds the shard awake, instead of
/// paying for the wake-up of a sleeping thread, tens of microseconds on a VM
/// (docs/same-host.md). One connection of the shard polls at a time, on the io_uring drivers
/// only ([`yield_to_driver`] needs one). `Some(n)`: `n` bytes were read into `rbuf` (0: the
/// client closed).
async fn spin_for_next(front: &Front, fd: RawFd, rbuf: &mut Vec<u8>) -> Option<usize> {
    let spin = std::time::Duration::from_micros(front.config().http.same_host_spin_us);
    // One connection of the shard polls at a time: several would only take turns.
    if spin.is_zero() || SPINNING.get() || !crate::shards::runtime::on_io_uring() {
        return None;
    }
    struct Spinning;
    impl Drop for Spinning {
        fn drop(&mut self) {
            SPINNING.set(false);
        }
    }
    SPINNING.set(true);
    let _spinning = Spinning;
    spin_polls(fd, rbuf, spin).await
}

thread_local! {
    /// Whether a same-host connection of this shard is polling for its next request.
    static SPINNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

async fn spin_polls(fd: RawFd, rbuf: &mut Vec<u8>, spin: std::time::Duration) -> Option<usize> {
    let t0 = Instant::now();
    loop {
        let spare = rbuf.spare_capacity_mut();
        // SAFETY: reads at most `spare.len()` bytes into the vector's spare capacity.
        let n = unsafe {
            libc::recv(
                fd,
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            // SAFETY: the kernel initialised `n` bytes.
            unsafe { rbuf.set_len(rbuf.len() + n as usize) };
            return Some(n as usize);
        }
        if n == 0 {
            return Some(0);
        }
        let e = std::io::Error::last_os_error().raw_os_error();
        if e != Some(libc::EAGAIN) && e != Some(libc::EINTR) || t0.elapsed() >= spin {
            return None;
        }
        // Another thread that needs this CPU (a shard's copy helper, the client itself) gets it.
        // SAFETY: no preconditions.
        unsafe { libc::sched_yield() };
        if !yield_to_driver().await {
            return None;
        }
    }
}

/// Lets the shard's other tasks run, and its driver reap every completion, once, without
/// letting the thread sleep: a byte written to a socket pair of the shard's is read back
/// through the driver, which parks to complete the read and finds it done at once. (A task
/// that woke itself instead would be run again before any other: monoio puts a task that is
/// woken while it runs at the front of its queue, so the shard's others starved; and with
/// DEFER_TASKRUN a ring posts completions only when the driver waits on it.) `false` when the
/// pair cannot be made (no polling then).
async fn yield_to_driver() -> bool {
    use std::os::fd::AsRawFd;
    let Some((mut read_end, write_end, buf)) = YIELDER.take().or_else(|| {
        let (a, b) = std::os::unix::net::UnixStream::pair().ok()?;
        a.set_nonblocking(true).ok()?;
        let a = monoio::net::UnixStream::from_std(a).ok()?;
        Some((a, b, Vec::with_capacity(16)))
    }) else {
        return false;
    };
    // SAFETY: one byte from a local into our own socket.
    let wrote = unsafe { libc::write(write_end.as_raw_fd(), [1u8].as_ptr().cast(), 1) } == 1;
    if !wrote {
        return false;
    }
    let (res, mut buf) = read_end.read(buf).await;
    buf.clear();
    if res.is_ok() {
        YIELDER.set(Some((read_end, write_end, buf)));
    }
    res.is_ok()
}

type Yielder = (
    monoio::net::UnixStream,
    std::os::unix::net::UnixStream,
    Vec<u8>,
);

thread_local! {
    /// The shard's socket pair for [`yield_to_driver`] (one polling connection uses it at a
    /// time).
    static YIELDER: std::cell::Cell<Option<Yielder>> = const { std::cell::Cell::new(None) };
}

/// Answers every complete request in the read buffer, in order. Returns where the
/// unprocessed bytes start and whether the connection closes, or `None` when it broke.
async fn answer_buffered<S: Io>(
    front: &Front,
    conn: &ConnGuard,
    stream: &mut S,
    b: &mut Bufs,
) -> Option<(usize, bool)> {
    let mut start = 0;
    loop {
        // The common case, a whole request already in the buffer, is parsed once here;
        // everything else (partial heads, chunked or large bodies, early answers) goes
        // through `frame`, which keeps the framing state.
        let complete = match b.pending {
            Pending::None => complete_request(front, &b.rbuf[start..]),
            _ => None,
        };
        let (head, verdict, req, early, since, advance) = if let Some((head, total, verdict)) =
            complete
        {
            let req = &b.rbuf[start..start + total];
            (head, verdict, req, None, None, total)
        } else {
            let (head_len, body_end, next, early) =
                match frame(front, &mut b.rbuf, start, &mut b.pending) {
                    Framed::NeedMore => {
                        if !matches!(b.pending, Pending::None) && b.body_since.is_none() {
                            b.body_since = Some(Instant::now());
                        }
                        return Some((start, false));
                    }
                    Framed::Stream { head_len, body_len } => {
                        b.body_since = None;
                        match answer_streamed(conn, stream, b, start, head_len, body_len).await? {
                            true => return Some((start, true)),
                            false => continue,
                        }
                    }
                    Framed::Malformed(e) => {
                        b.body_since = None;
                        conn.set(ConnState::Busy);
                        answer_malformed(front, e, &mut b.scratch, &mut b.wbuf);
                        return Some((start, true));
                    }
                    Framed::Request {
                        head_len,
                        body_end,
                        next,
                        early,
                    } => (head_len, body_end, next, early),
                };
            let req = &b.rbuf[start..start + body_end];
            let Parsed::Complete(head) = parse_head(&req[..head_len]) else {
                unreachable!("a framed head parses again");
            };
            let verdict = verdict(front, &head);
            (head, verdict, req, early, b.body_since.take(), next)
        };
        conn.set(ConnState::Busy);
        let closes = answer(
            front,
            stream,
            b.direct,
            b.peer.as_ref(),
            &head,
            verdict,
            req,
            early,
            since,
            &mut b.scratch,
            &mut b.wbuf,
        )
        .await?;
        b.continue_sent = false;
        start += advance;
        if closes {
            return Some((start, true));
        }
        if b.wbuf.len() >= WRITE_BUF_FLUSH_BYTES && !flush(stream, &mut b.wbuf).await {
            return None;
        }
    }
}

/// A put whose body is still arriving, at `rbuf[start..]`: the answers before it go out
/// first, then its body streams into its blobs. The rest of the buffer was its body. Returns
/// whether the connection closes, `None` when it broke.
async fn answer_streamed<S: Io>(
    conn: &ConnGuard,
    stream: &mut S,
    b: &mut Bufs,
    start: usize,
    head_len: usize,
    body_len: usize,
) -> Option<bool> {
    if !b.wbuf.is_empty() && !flush(stream, &mut b.wbuf).await {
        return None;
    }
    let req = &b.rbuf[start..];
    let streamed = stream_put(
        conn,
        stream,
        req,
        head_len,
        body_len,
        &mut b.scratch,
        &mut b.wbuf,
    )
    .await;
    b.rbuf.truncate(start);
    b.continue_sent = false;
    streamed
}

/// Makes room to read more: at least a few KiB, all of a known body. False when the shard's
/// buffer budget is spent: the connection was then answered 429 and closed.
async fn make_room<S: Io>(
    front: &Front,
    charge: &mut BufferCharge<'_>,
    stream: &mut S,
    fd: RawFd,
    b: &mut Bufs,
) -> bool {
    let want = match &b.pending {
        Pending::Length { total, .. } => total.saturating_sub(b.rbuf.len()),
        _ => 0,
    };
    let needed = want.max(4096);
    if b.rbuf.capacity() - b.rbuf.len() >= needed {
        return true;
    }
    // The capacity `reserve` will pick (it doubles, or takes exactly what is needed).
    let grown = (b.rbuf.capacity() * 2).max(b.rbuf.len() + needed);
    if !charge.fits(grown) {
        // The shard's connections already hold their budget of buffered requests: shed this
        // one rather than grow memory without bound.
        let mut ctx = Ctx {
            shard: front.shard(),
            scratch: &mut b.scratch,
            trace: None,
        };
        let mut resp = ctx.overloaded();
        resp.close = true;
        front.encode(resp, None, &b.scratch, &mut b.wbuf);
        if flush(stream, &mut b.wbuf).await {
            linger(stream, fd, std::mem::take(&mut b.rbuf)).await;
        }
        return false;
    }
    b.rbuf.reserve(needed);
    charge.settle(b.rbuf.capacity());
    true
}

/// The part of a connection's read buffer charged to its shard's budget
/// (`ock.mmc.http.max_buffered_bytes_per_shard`): its capacity beyond the initial size.
struct BufferCharge<'a> {
    front: &'a Front,
    bytes: usize,
}

impl BufferCharge<'_> {
    /// Whether the buffer may grow to `capacity` within the shard's budget.
    fn fits(&self, capacity: usize) -> bool {
        let extra = capacity.saturating_sub(READ_BUF_INITIAL_BYTES);
        let held = self.front.shard().stats().buffered_bytes.get() as u64;
        let limit = self.front.config().http.max_buffered_bytes_per_shard;
        held - self.bytes as u64 + extra as u64 <= limit
    }

    /// Charges the buffer's capacity now.
    fn settle(&mut self, capacity: usize) {
        let extra = capacity.saturating_sub(READ_BUF_INITIAL_BYTES);
        let stats = self.front.shard().stats();
        stats.buffered_bytes.add(extra as i64 - self.bytes as i64);
        self.bytes = extra;
    }
}

impl Drop for BufferCharge<'_> {
    fn drop(&mut self) {
        self.settle(0);
    }
}

pub(super) async fn flush<S: Io>(stream: &mut S, wbuf: &mut Vec<u8>) -> bool {
    let buf = std::mem::take(wbuf);
    let (res, mut buf) = stream.write_all(buf).await;
    buf.clear();
    *wbuf = buf;
    res.is_ok()
}

/// Writes the answers in `wbuf` before the connection reads again. On a plain socket
/// (`direct`) they are first offered to the socket with one non-blocking `send`, which takes
/// them whole when its buffer has room (the usual case: answers are small); the rest, if any,
/// goes through the runtime as usual. One system call instead of a ring submission and a
/// second trip through the loop before the next read is queued. `last`: the connection
/// closes after them (`linger` shuts the write side down at once), so their final partial
/// segment waits for the FIN and carries it.
async fn flush_answers<S: Io>(
    stream: &mut S,
    direct: Option<RawFd>,
    last: bool,
    wbuf: &mut Vec<u8>,
) -> bool {
    if let Some(fd) = direct {
        let mut flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        if last {
            flags |= libc::MSG_MORE;
        }
        // SAFETY: `fd` is the open socket under `stream`; the buffer is valid for its length.
        let n = unsafe { libc::send(fd, wbuf.as_ptr().cast(), wbuf.len(), flags) };
        if n >= 0 {
            let n = n as usize;
            if n == wbuf.len() {
                wbuf.clear();
                return true;
            }
            wbuf.drain(..n);
        } else {
            let e = std::io::Error::last_os_error().raw_os_error();
            if e != Some(libc::EAGAIN) && e != Some(libc::EINTR) {
                return false;
            }
        }
    }
    flush(stream, wbuf).await
}

/// Writes the answers in `wbuf` and then `body` (an answer's body, after its head in `wbuf`)
/// to the plain socket `fd` with one non-blocking vectored `sendmsg`, which takes them whole
/// when its buffer has room; what it does not take is left in `wbuf` (the body's rest
/// copied there) for the connection's next flush. False: the connection broke.
pub(super) fn send_with_body(fd: RawFd, wbuf: &mut Vec<u8>, body: &[u8]) -> bool {
    let mut iov = [
        libc::iovec {
            iov_base: wbuf.as_ptr() as *mut libc::c_void,
            iov_len: wbuf.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `fd` is the open socket of the connection; the iovecs point into `wbuf` and
    // `body`, valid for their lengths and unchanged during the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    let sent = if n >= 0 {
        n as usize
    } else {
        let e = std::io::Error::last_os_error().raw_os_error();
        if e != Some(libc::EAGAIN) && e != Some(libc::EINTR) {
            return false;
        }
        0
    };
    if sent >= wbuf.len() {
        let from = sent - wbuf.len();
        wbuf.clear();
        wbuf.extend_from_slice(&body[from..]);
    } else {
        wbuf.drain(..sent);
        wbuf.extend_from_slice(body);
    }
    true
}

/// Holds back a partial segment until the socket's write side is shut down (`linger`), so a
/// connection's last answer carries its FIN: one segment for the client to receive and
/// acknowledge instead of two (a refused `Expect: 100-continue` put's 307, an error that
/// closes). Best effort: without it the FIN follows in a segment of its own.
fn cork(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: the fd is the open socket of the connection; the option is an int.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Closes gracefully after an error answer: stop sending, then read and discard what the
/// client still sends (bounded in bytes and time), so the kernel does not reset the connection
/// and destroy the answer before the client read it.
pub(super) async fn linger<S: Io>(stream: &mut S, fd: RawFd, buf: Vec<u8>) {
    // A stream whose writes complete when queued (the front ring's) sends them first.
    let _ = stream.flush().await;
    // SAFETY: the fd is open for the lifetime of `stream`.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let deadline = std::time::Instant::now() + Duration::from_millis(LINGER_MS);
    linger_until(stream, buf, deadline, 0).await;
}

/// [`linger`] on a plain socket with nothing unread, whose client is expected to close
/// rather than send (a refused `Expect: 100-continue` put, an error answer): instead of a
/// read that wakes the shard when the client's FIN arrives, the socket is looked at without
/// blocking now and at each housekeeping tick (which wakes the shard anyway) until the
/// client closed or `LINGER_MS` passed. A client that sends after all is read off at once,
/// as by [`linger`]. Ends early when the server drains.
async fn linger_at_ticks<S: Io>(front: &Front, stream: &mut S, fd: RawFd) {
    // SAFETY: the fd is open for the lifetime of `stream`.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let deadline = std::time::Instant::now() + Duration::from_millis(LINGER_MS);
    let mut chunk = [0u8; 1024];
    loop {
        // SAFETY: the fd is open; `chunk` is writable for its length.
        let n = unsafe {
            libc::recv(
                fd,
                chunk.as_mut_ptr().cast(),
                chunk.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return; // the client closed
        }
        if n > 0 {
            // It is sending: read the rest off as it comes.
            linger_until(stream, Vec::new(), deadline, n as usize).await;
            return;
        }
        let e = std::io::Error::last_os_error().raw_os_error();
        if e != Some(libc::EAGAIN) && e != Some(libc::EINTR) {
            return;
        }
        if front.is_draining() || std::time::Instant::now() >= deadline {
            return;
        }
        front.next_tick().await;
    }
}

/// Reads and discards until the client closes, `LINGER_DISCARD_BYTES` (counting
/// `discarded`) or `deadline`.
async fn linger_until<S: Io>(
    stream: &mut S,
    mut buf: Vec<u8>,
    deadline: std::time::Instant,
    mut discarded: usize,
) {
    buf.clear();
    buf.reserve(16 * 1024);
    while discarded < LINGER_DISCARD_BYTES {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        buf.clear();
        let read = monoio::time::timeout(left, stream.read(buf)).await;
        match read {
            Ok((Ok(n), b)) if n > 0 => {
                discarded += n;
                buf = b;
            }
            _ => break,
        }
    }
}
