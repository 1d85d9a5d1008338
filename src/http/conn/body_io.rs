//! Body I/O: a streamed put's body from the socket into its blobs, bodies read only to be
//! dropped, and answers' tails (blobs, key listings) from where they are to the socket.

use monoio::buf::IoBufMut;
use monoio::io::AsyncWriteRentExt;

use super::Io;
use crate::http::handlers::keys_stream::KeyCursor;
use crate::http::handlers::{self, Ctx, Request};
use crate::http::parse::{Head, Parsed, parse_head};
use crate::http::response::{KeyListing, Part, Response, Tail};
use crate::http::router::Route;
use crate::http::{ConnGuard, ConnState, Front};
use crate::limits::{STAGING_BYTES, STAGING_POOL_BUFFERS};
use crate::shards::WriteGrant;
use crate::shards::store::BlobView;
use crate::shards::store::ssd::IoBuffer;

/// Serves a put whose body is still arriving ([`Framed::Stream`]): the owner allocates first,
/// then the body goes from the socket into the blobs (host memory directly; device memory
/// through a bounded staging buffer), then the commit. `req` is the head and the body bytes
/// that already arrived. The answer is encoded into `wbuf`. Returns whether the connection
/// closes after it, or `None` when it broke (an allocation is then aborted).
pub(super) async fn stream_put<S: Io>(
    conn: &ConnGuard,
    stream: &mut S,
    req: &[u8],
    head_len: usize,
    body_len: usize,
    scratch: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
) -> Option<bool> {
    let Parsed::Complete(head) = parse_head(&req[..head_len]) else {
        unreachable!("a framed head parses again");
    };
    let received = &req[head_len..];
    debug_assert!(received.len() < body_len);
    // Allocating is the server's time; the body's deadlines start with its first read.
    conn.set(ConnState::Busy);
    let started = std::time::Instant::now();
    let shard = conn.front.shard();
    shard.stats().http_requests.inc();
    let telemetry = &shard.shared.exports.telemetry;
    let span = crate::http::spans::RequestSpan::start(telemetry, &head, started);
    let trace = span.as_ref().map(|s| s.context());
    let mut ctx = Ctx {
        shard,
        scratch,
        trace,
    };
    // With `Expect: 100-continue` the client sends the body only after our go-ahead, so a put
    // refused before allocation is answered at once and the connection closed.
    let mut refused_unread = false;
    let resp = match shard.load.enter() {
        None => {
            let mut r = ctx.overloaded();
            r.close = true;
            r
        }
        Some(_working) => {
            let request = Request {
                head: &head,
                route: Route::Objects,
                body: &[],
                body_since: None,
                dispatched: std::time::Instant::now(),
            };
            let expect_continue = head.expect_continue;
            let fill = async |grant: Option<&WriteGrant>| {
                let body = (received, body_len);
                receive_body(
                    conn,
                    stream,
                    expect_continue,
                    grant,
                    body,
                    &mut refused_unread,
                )
                .await
            };
            let resp = handlers::put_streamed(&request, &mut ctx, body_len as u64, fill).await?;
            // The body is in: its deadlines no longer apply to the answer.
            conn.set(ConnState::Busy);
            resp
        }
    };
    let close = refused_unread || !head.keep_alive || conn.front.is_draining();
    if let Some(span) = span {
        let (id, shards) = (shard.id, shard.shared.shard_count());
        let body = body_len as u64;
        let route = Some(Route::Objects);
        span.finish(
            telemetry,
            &head,
            route,
            id,
            shards,
            body,
            &resp,
            scratch.len(),
        );
    }
    Some(encode_put_answer(
        conn, &head, resp, close, started, scratch, wbuf,
    ))
}

/// A streamed put's body, once the owner answered the allocation (`body`: the bytes that
/// came with the head, and the body's length). With a grant the body goes into its blobs
/// (after the `100 Continue` a client may be waiting for); without one it is read and
/// dropped, or, when the client waits for a go-ahead, never asked for (`refused_unread`).
async fn receive_body<S: Io>(
    conn: &ConnGuard,
    stream: &mut S,
    expect_continue: bool,
    grant: Option<&WriteGrant>,
    (received, body_len): (&[u8], usize),
    refused_unread: &mut bool,
) -> handlers::Filled {
    match grant {
        None if expect_continue => {
            *refused_unread = true;
            handlers::Filled::Ok
        }
        None => {
            let mut clock = BodyClock::start(&conn.front, conn, received.len());
            discard_body(stream, body_len - received.len(), &mut clock).await
        }
        Some(grant) => {
            if expect_continue
                && stream
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                    .await
                    .0
                    .is_err()
            {
                return handlers::Filled::Broken;
            }
            let mut clock = BodyClock::start(&conn.front, conn, received.len());
            fill_blobs(stream, grant, received, body_len, &mut clock).await
        }
    }
}

/// Encodes a streamed put's answer into `wbuf` (closing the connection after it when `close`
/// or the answer says so) and records the request's duration. Whether the connection closes.
fn encode_put_answer(
    conn: &ConnGuard,
    head: &Head<'_>,
    mut resp: Response,
    close: bool,
    started: std::time::Instant,
    scratch: &[u8],
    wbuf: &mut Vec<u8>,
) -> bool {
    resp.close |= close;
    let close = resp.close;
    let front: &Front = &conn.front;
    let tail = front.encode(resp, Some(head), scratch, wbuf);
    debug_assert!(tail.is_none(), "a put's answer is JSON");
    let durations = &front.shard().stats().request_durations;
    durations.observe(crate::metrics::requests::ReqOp::Put, started.elapsed());
    close
}

/// The deadlines of a streamed body, kept in the connection's registry entry for the sweep
/// (which ends the reads of a body past its deadline). The next bytes are due within
/// `ock.mmc.http.body_timeout_ms` of the last read (nginx's `client_body_timeout`), and the
/// body as a whole must keep up with `ock.mmc.http.body_min_rate_bytes_per_sec` after a first
/// `body_timeout_ms` of grace: a client trickling a byte a second is cut as surely as a silent one.
pub(super) struct BodyClock<'a> {
    conn: &'a ConnGuard,
    start_ms: u64,
    timeout_ms: u64,
    min_rate: u64,
    received: u64,
}

impl<'a> BodyClock<'a> {
    /// A body of which `received` bytes already arrived with the head.
    pub(super) fn start(front: &Front, conn: &'a ConnGuard, received: usize) -> BodyClock<'a> {
        let config = front.config();
        let mut clock = BodyClock {
            conn,
            start_ms: conn.now_ms(),
            timeout_ms: config.body_timeout_ms(),
            min_rate: config.http.body_min_rate_bytes_per_sec,
            received: 0,
        };
        clock.advance(received);
        clock
    }

    /// `n` more bytes arrived: move the deadline.
    pub(super) fn advance(&mut self, n: usize) {
        self.received += n as u64;
        let idle = self.conn.now_ms().saturating_add(self.timeout_ms);
        let paced = match self.min_rate {
            0 => u64::MAX,
            rate => self
                .start_ms
                .saturating_add(self.timeout_ms)
                .saturating_add(self.received.saturating_mul(1000) / rate),
        };
        self.conn.body_deadline(idle.min(paced));
    }

    /// A read ended without bytes: the sweep's doing (408) or the client's (nobody to answer).
    pub(super) fn ended(&self) -> handlers::Filled {
        if self.conn.body_timed_out() {
            handlers::Filled::TimedOut
        } else {
            handlers::Filled::Broken
        }
    }
}

/// Moves a body into every blob of `grant`: `received` (already read), then the rest from the
/// socket. One host-memory blob is read into directly; otherwise the bytes pass through a
/// staging buffer of at most [`STAGING_BYTES`]. The grant is checked between reads: once the
/// owner revoked it (the key was removed, the allocation reclaimed) nothing more is written
/// into the blobs and the rest of the body is read and dropped.
pub(super) async fn fill_blobs<S: Io>(
    stream: &mut S,
    grant: &WriteGrant,
    received: &[u8],
    body_len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    if grant.is_revoked() {
        return discard_body(stream, body_len - received.len(), clock).await;
    }
    if let Err(e) = write_to_blobs(grant, 0, received) {
        return handlers::Filled::SegmentError(e);
    }
    grant.wrote(received.len() as u64);
    match &grant.blobs[..] {
        [b] if b.seg.backend.host_region().is_some() => {
            read_into_host_blob(stream, grant, b, received.len(), body_len, clock).await
        }
        _ => read_through_staging(stream, grant, received.len(), body_len, clock).await,
    }
}

/// Copies `data` into every blob of `grant` at `offset`.
fn write_to_blobs(grant: &WriteGrant, offset: usize, data: &[u8]) -> std::io::Result<()> {
    for b in &grant.blobs[..] {
        // SAFETY: the blobs are the grant's until it ends (commit or abort), even when it is
        // revoked; it is checked before every write.
        unsafe { b.seg.backend.write(b.offset + offset as u64, data)? };
    }
    Ok(())
}

/// The rest of a body (from `filled`) read from the socket straight into the grant's one
/// host-memory blob `b`.
async fn read_into_host_blob<S: Io>(
    stream: &mut S,
    grant: &WriteGrant,
    b: &BlobView,
    mut filled: usize,
    body_len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    while filled < body_len {
        if grant.is_revoked() {
            return discard_body(stream, body_len - filled, clock).await;
        }
        // SAFETY: the blob is this grant's until it ends, and the grant (held by our caller)
        // outlives the read; a revoked grant is not read into again.
        let view = unsafe {
            IoBuffer::segment_view(
                b.seg.clone(),
                b.offset + filled as u64,
                body_len - filled,
                false,
            )
        };
        let view = match view {
            Ok(v) => v,
            Err(e) => return handlers::Filled::SegmentError(e),
        };
        match stream.read(view).await.0 {
            Ok(0) | Err(_) => return clock.ended(),
            Ok(n) => {
                filled += n;
                grant.wrote(n as u64);
                clock.advance(n);
            }
        }
    }
    handlers::Filled::Ok
}

/// The rest of a body (from `filled`) read through a staging buffer and copied into every
/// blob of the grant (device memory, or an object in several blobs).
async fn read_through_staging<S: Io>(
    stream: &mut S,
    grant: &WriteGrant,
    mut filled: usize,
    body_len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    let mut failed = None;
    let whole = read_staged(stream, body_len - filled, clock, |chunk| {
        // After a failed copy (or once the grant is revoked) the rest of the body is still
        // read, and dropped.
        if failed.is_none()
            && !grant.is_revoked()
            && let Err(e) = write_to_blobs(grant, filled, chunk)
        {
            failed = Some(e);
        }
        filled += chunk.len();
        grant.wrote(chunk.len() as u64);
    })
    .await;
    if !whole {
        return clock.ended();
    }
    failed.map_or(handlers::Filled::Ok, handlers::Filled::SegmentError)
}

/// Reads and drops `len` body bytes, under the body's deadlines.
pub(super) async fn discard_body<S: Io>(
    stream: &mut S,
    len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    if read_staged(stream, len, clock, |_| {}).await {
        handlers::Filled::Ok
    } else {
        clock.ended()
    }
}

/// Reads `len` body bytes through a staging buffer under the body's deadlines, handing each
/// chunk to `take` as it arrives. `false`: the connection ended first.
#[inline]
async fn read_staged<S: Io>(
    stream: &mut S,
    mut len: usize,
    clock: &mut BodyClock<'_>,
    mut take: impl FnMut(&[u8]),
) -> bool {
    let mut buf = staging::take();
    while len > 0 {
        let want = buf.capacity().min(len);
        buf.clear();
        let (res, slice) = stream.read(buf.slice_mut(0..want)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                take(&buf[..n]);
                len -= n;
                clock.advance(n);
            }
        }
    }
    staging::give(buf);
    true
}

/// Staging buffers ([`STAGING_BYTES`] each) reused by this thread's (this shard's)
/// connections: bytes on their way to or from device memory, and bodies read only to be
/// dropped. A buffer allocated per request is a fresh mapping each time (the allocator
/// returns a megabyte to the kernel on free): every page faulted in and zeroed again, which
/// made a 1 MiB get from HBM cost 3.6 times the CPU of one from DRAM.
pub(super) mod staging {
    use std::cell::RefCell;

    use super::{STAGING_BYTES, STAGING_POOL_BUFFERS};

    thread_local! {
        static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// A buffer of [`STAGING_BYTES`] capacity (its length is whatever its last use left).
    pub fn take() -> Vec<u8> {
        POOL.with(|p| p.borrow_mut().pop())
            .unwrap_or_else(|| Vec::with_capacity(STAGING_BYTES))
    }

    /// Gives a buffer back; past [`STAGING_POOL_BUFFERS`] kept (or a smaller one), it is freed.
    pub fn give(buf: Vec<u8>) {
        if buf.capacity() < STAGING_BYTES {
            return;
        }
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < STAGING_POOL_BUFFERS {
                p.push(buf);
            }
        });
    }

    #[cfg(test)]
    pub fn pooled() -> usize {
        POOL.with(|p| p.borrow().len())
    }
}

/// Writes an answer's head (`wbuf`: it and any answers queued before it) and the body parts
/// that follow it: shared bytes and pinned blobs (host memory straight from the segment;
/// device memory through a bounded buffer), or a key stream. The head and the parts the
/// socket can read where they are go out together, in one vectored write ([`Gather`]): a GET
/// of a blob is one send, not a small send of its head and then the blob (the head went out
/// as its own packet and woke the client for it alone).
pub(super) async fn write_tail<S: Io>(
    front: &Front,
    stream: &mut S,
    wbuf: &mut Vec<u8>,
    tail: Tail,
    http10: bool,
) -> bool {
    match tail {
        Tail::Parts(parts) => {
            let mut parts = parts.into_iter().peekable();
            let mut head = std::mem::take(wbuf);
            loop {
                let mut gather = Gather::new(head);
                while gather.iov.len() < GATHER_MAX_IOVECS
                    && let Some(part) = parts.next_if(Gather::addressable)
                {
                    if !gather.push(part) {
                        return false;
                    }
                }
                let (ok, g) = gather.write(stream).await;
                head = g.into_head();
                if !ok {
                    return false;
                }
                match parts.peek() {
                    None => break,
                    // More parts than one write takes: the next write.
                    Some(p) if Gather::addressable(p) => {}
                    // Device memory: staged, a buffer at a time, after what came before it.
                    Some(_) => {
                        let Some(Part::Blob(p)) = parts.next() else {
                            unreachable!("only a blob can be unaddressable")
                        };
                        if !write_blob(stream, &p).await {
                            return false;
                        }
                    }
                }
            }
            *wbuf = head;
            true
        }
        Tail::KeyStream(listing) => {
            super::flush(stream, wbuf).await && stream_keys(front, stream, listing, !http10).await
        }
        Tail::Scratch => unreachable!("a body in place in scratch is written by `answer`"),
    }
}

/// Parts per vectored write, below the kernel's `IOV_MAX` (1024).
const GATHER_MAX_IOVECS: usize = 512;

/// A vectored write of an answer's head and the parts after it that the socket can read where
/// they are (shared bytes, blobs in host memory), owning what the kernel reads until the write
/// completes: the head's buffer, the bytes, each blob's pin and a view that keeps its segment
/// mapped (an abandoned write's buffers live on in the runtime until the kernel is done).
struct Gather {
    head: Vec<u8>,
    held: Vec<Held>,
    iov: Vec<libc::iovec>,
    /// The first entry of `iov` not yet written.
    sent: usize,
}

enum Held {
    Bytes(bytes::Bytes),
    /// A blob's pin (held until the write is over) and a view of its bytes (which keeps its
    /// segment mapped).
    Blob {
        _pin: crate::shards::PinnedBlob,
        view: crate::shards::store::ssd::IoBuffer,
    },
}

// SAFETY: `iov` points into `head`'s heap buffer and into what `held` keeps alive (shared
// bytes, pinned blobs in mapped segments); none of them moves or is freed while the Gather
// lives, and `iov` is not changed after the write was handed over.
unsafe impl monoio::buf::IoVecBuf for Gather {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov[self.sent..].as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len() - self.sent
    }
}

impl Gather {
    fn new(mut head: Vec<u8>) -> Gather {
        let mut iov = Vec::with_capacity(4);
        if !head.is_empty() {
            iov.push(libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head.len(),
            });
        }
        Gather {
            head,
            held: Vec::new(),
            iov,
            sent: 0,
        }
    }

    /// Writes everything, resuming after short writes. (monoio 0.2.4's `write_vectored_all`
    /// does not advance an entry it wrote in part: it sends those bytes again, then panics.)
    async fn write<S: Io>(mut self, stream: &mut S) -> (bool, Gather) {
        while self.sent < self.iov.len() {
            let (res, g) = stream.writev(self).await;
            self = g;
            match res {
                Ok(0) => return (false, self),
                Ok(n) => self.consume(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return (false, self),
            }
        }
        (true, self)
    }

    /// `n` more bytes were written: skips the entries done, shortens a part-written one.
    fn consume(&mut self, mut n: usize) {
        while n > 0 && self.sent < self.iov.len() {
            let e = &mut self.iov[self.sent];
            let step = n.min(e.iov_len);
            // SAFETY: within the entry's buffer (step <= its length).
            e.iov_base = unsafe { e.iov_base.cast::<u8>().add(step) }.cast();
            e.iov_len -= step;
            n -= step;
            if e.iov_len == 0 {
                self.sent += 1;
            }
        }
    }

    fn addressable_blob(p: &crate::shards::PinnedBlob) -> bool {
        p.view.seg.backend.host_region().is_some()
    }

    fn addressable(part: &Part) -> bool {
        match part {
            Part::Bytes(_) => true,
            Part::Blob(p) => Self::addressable_blob(p),
        }
    }

    /// Adds an addressable part (see [`Gather::addressable`]). False when a blob's range is
    /// not in its segment (the answer cannot be sent).
    fn push(&mut self, part: Part) -> bool {
        use crate::shards::store::ssd::IoBuffer;
        use monoio::buf::IoBuf;
        let held = match part {
            Part::Bytes(b) => Held::Bytes(b),
            Part::Blob(p) => {
                let v = &p.view;
                // SAFETY: the blob is pinned (readable, never written) while `p` lives, and
                // `p` is held with the view until the write is over.
                match unsafe {
                    IoBuffer::segment_view(v.seg.clone(), v.offset, v.len as usize, true)
                } {
                    Ok(view) => Held::Blob { _pin: p, view },
                    Err(_) => return false,
                }
            }
        };
        let (ptr, len) = match &held {
            Held::Bytes(b) => (b.as_ptr(), b.len()),
            Held::Blob { view, .. } => (view.read_ptr(), view.bytes_init()),
        };
        if len > 0 {
            self.iov.push(libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            });
        }
        self.held.push(held);
        true
    }

    /// The head's buffer back, emptied, for the connection's next answers.
    fn into_head(self) -> Vec<u8> {
        let mut head = self.head;
        head.clear();
        head
    }
}

pub(super) async fn write_blob<S: Io>(stream: &mut S, p: &crate::shards::PinnedBlob) -> bool {
    use crate::shards::store::ssd::IoBuffer;
    let v = &p.view;
    let len = v.len as usize;
    if v.seg.backend.host_region().is_some() {
        // SAFETY: the blob is pinned (readable, never written) until `p` is dropped, after
        // this write completes.
        return match unsafe { IoBuffer::segment_view(v.seg.clone(), v.offset, len, true) } {
            Ok(buf) => stream.write_all(buf).await.0.is_ok(),
            Err(_) => false,
        };
    }
    // Device memory is not addressable here: copy out a staging buffer at a time.
    let mut buf = staging::take();
    let mut done = 0;
    while done < len {
        let n = STAGING_BYTES.min(len - done);
        // Only a buffer shorter than `n` is zero-filled (up to `n`), once; then it is
        // overwritten by the device's bytes.
        buf.resize(n, 0);
        // SAFETY: as above.
        if unsafe { v.seg.backend.read(v.offset + done as u64, &mut buf) }.is_err() {
            return false;
        }
        let (res, b) = stream.write_all(buf).await;
        buf = b;
        if res.is_err() {
            return false;
        }
        done += n;
    }
    staging::give(buf);
    true
}

/// Streams `/get_all_keys` shard by shard, one page per chunk.
pub(super) async fn stream_keys<S: Io>(
    front: &Front,
    stream: &mut S,
    listing: KeyListing,
    chunked: bool,
) -> bool {
    let mut cursor = KeyCursor::new(listing.limit);
    while let Some(page) = cursor.next_page(front.shard(), &listing.prefix).await {
        let Ok(text) = page else {
            log::warn!(
                "shard {}: a key listing failed midway; closing the stream",
                front.shard().id
            );
            return false;
        };
        let out = if chunked {
            let mut framed = Vec::with_capacity(text.len() + 20);
            framed.extend_from_slice(format!("{:x}\r\n", text.len()).as_bytes());
            framed.extend_from_slice(&text);
            framed.extend_from_slice(b"\r\n");
            framed
        } else {
            text
        };
        if stream.write_all(out).await.0.is_err() {
            return false;
        }
    }
    !chunked || stream.write_all(&b"0\r\n\r\n"[..]).await.0.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a gather still has to write, in order.
    fn unsent(g: &Gather) -> Vec<u8> {
        let mut out = Vec::new();
        for e in &g.iov[g.sent..] {
            // SAFETY: the entries point into buffers `g` holds.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(e.iov_base.cast::<u8>(), e.iov_len)
            });
        }
        out
    }

    #[test]
    fn a_gather_resumes_after_short_writes_where_they_stopped() {
        let whole = b"HTTP/1.1 200 OK\r\n\r\n0123456789abcdefXYZ".to_vec();
        // Short writes that end inside an entry, exactly at an entry's end, across several.
        for steps in [
            vec![3, 5, 12, 1, 9, 8],
            vec![19, 16, 3],
            vec![1; 38],
            vec![38],
            vec![25, 13],
        ] {
            let mut g = Gather::new(b"HTTP/1.1 200 OK\r\n\r\n".to_vec());
            assert!(g.push(Part::Bytes(bytes::Bytes::from_static(b"0123456789abcdef"))));
            assert!(g.push(Part::Bytes(bytes::Bytes::new())), "an empty part");
            assert!(g.push(Part::Bytes(bytes::Bytes::from_static(b"XYZ"))));
            assert_eq!(g.iov.len(), 3, "no entry for the empty part");
            assert_eq!(unsent(&g), whole);
            let mut done = 0;
            for n in steps {
                g.consume(n);
                done += n;
                assert_eq!(unsent(&g), whole[done..], "after {done} bytes");
                assert_eq!(
                    monoio::buf::IoVecBuf::read_iovec_len(&g),
                    g.iov.len() - g.sent
                );
            }
            assert_eq!(g.sent, g.iov.len(), "all written");
            assert!(g.into_head().is_empty(), "the head buffer comes back empty");
        }
        // Without a head (nothing queued before the parts), no empty first entry.
        let mut g = Gather::new(Vec::new());
        assert!(g.push(Part::Bytes(bytes::Bytes::from_static(b"ab"))));
        assert_eq!(g.iov.len(), 1);
    }

    #[test]
    fn staging_buffers_are_reused_up_to_the_pool_size() {
        let a = staging::take();
        assert_eq!(a.capacity(), STAGING_BYTES);
        let ptr = a.as_ptr();
        staging::give(a);
        let b = staging::take();
        assert_eq!(b.as_ptr(), ptr, "the same buffer comes back");
        staging::give(b);
        // More buffers out at once than the pool keeps: the extra ones are freed.
        let many: Vec<Vec<u8>> = (0..STAGING_POOL_BUFFERS + 3)
            .map(|_| staging::take())
            .collect();
        assert_eq!(staging::pooled(), 0);
        for b in many {
            staging::give(b);
        }
        assert_eq!(staging::pooled(), STAGING_POOL_BUFFERS);
        // A buffer of another size is not kept.
        let mut c = staging::take();
        c.shrink_to(0);
        staging::give(c);
        assert_eq!(staging::pooled(), STAGING_POOL_BUFFERS - 1);
    }
}
