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
    let mut ctx = Ctx { shard, scratch };
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
    let mut staging = staging::take();
    let mut failed = None;
    while filled < body_len {
        let want = staging.capacity().min(body_len - filled);
        staging.clear();
        let (res, slice) = stream.read(staging.slice_mut(0..want)).await;
        staging = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return clock.ended(),
            Ok(n) => {
                // After a failed copy (or once the grant is revoked) the rest of the body is
                // still read, and dropped.
                if failed.is_none()
                    && !grant.is_revoked()
                    && let Err(e) = write_to_blobs(grant, filled, &staging[..n])
                {
                    failed = Some(e);
                }
                filled += n;
                grant.wrote(n as u64);
                clock.advance(n);
            }
        }
    }
    staging::give(staging);
    failed.map_or(handlers::Filled::Ok, handlers::Filled::SegmentError)
}

/// Reads and drops `len` body bytes, under the body's deadlines.
pub(super) async fn discard_body<S: Io>(
    stream: &mut S,
    mut len: usize,
    clock: &mut BodyClock<'_>,
) -> handlers::Filled {
    let mut buf = staging::take();
    while len > 0 {
        let want = buf.capacity().min(len);
        buf.clear();
        let (res, slice) = stream.read(buf.slice_mut(0..want)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return clock.ended(),
            Ok(n) => {
                len -= n;
                clock.advance(n);
            }
        }
    }
    staging::give(buf);
    handlers::Filled::Ok
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

/// Writes the body parts that follow a head: shared bytes and pinned blobs (host memory
/// straight from the segment; device memory through a bounded buffer), or a key stream.
pub(super) async fn write_tail<S: Io>(
    front: &Front,
    stream: &mut S,
    tail: Tail,
    http10: bool,
) -> bool {
    match tail {
        Tail::Parts(parts) => {
            for part in parts {
                let ok = match part {
                    Part::Bytes(b) => stream.write_all(b).await.0.is_ok(),
                    Part::Blob(p) => write_blob(stream, &p).await,
                };
                if !ok {
                    return false;
                }
            }
            true
        }
        Tail::KeyStream(listing) => stream_keys(front, stream, listing, !http10).await,
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
