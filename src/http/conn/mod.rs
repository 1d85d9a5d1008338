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

use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::handlers::Ctx;
use super::parse::{Parsed, parse_head};
use super::{ConnState, Front};
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

/// Serves one connection. `fd` is the socket under `stream` (the housekeeping tick shuts it
/// down to end idle or stalled connections).
pub async fn run<S: Io>(front: Rc<Front>, mut stream: S, fd: RawFd) {
    let conn = front.register(fd);
    let mut rbuf: Vec<u8> = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
    let mut wbuf: Vec<u8> = Vec::with_capacity(4096);
    let mut scratch: Vec<u8> = Vec::new();
    let mut pending = Pending::None;
    // When the body of the request being framed started to arrive over several reads (its
    // receiving counts in a put's transfer time).
    let mut body_since: Option<Instant> = None;
    let mut continue_sent = false;
    let mut charge = BufferCharge {
        front: &front,
        bytes: 0,
    };

    loop {
        // Answer every complete request in the buffer.
        let mut start = 0;
        let mut close = false;
        loop {
            // The common case, a whole request already in the buffer, is parsed once here;
            // everything else (partial heads, chunked or large bodies, early answers) goes
            // through `frame`, which keeps the framing state.
            let complete = match pending {
                Pending::None => complete_request(&front, &rbuf[start..]),
                _ => None,
            };
            let (closes, advance) = if let Some((head, total, verdict)) = complete {
                conn.set(ConnState::Busy);
                let req = &rbuf[start..start + total];
                let answered = answer(
                    &front,
                    &mut stream,
                    &head,
                    verdict,
                    req,
                    None,
                    None,
                    &mut scratch,
                    &mut wbuf,
                );
                let Some(closes) = answered.await else {
                    return;
                };
                (closes, total)
            } else {
                let (head_len, body_end, next, early) =
                    match frame(&front, &mut rbuf, start, &mut pending) {
                        Framed::NeedMore => {
                            if !matches!(pending, Pending::None) && body_since.is_none() {
                                body_since = Some(Instant::now());
                            }
                            break;
                        }
                        Framed::Stream { head_len, body_len } => {
                            body_since = None;
                            // The answers before this one go out first (they are complete).
                            if !wbuf.is_empty() && !flush(&mut stream, &mut wbuf).await {
                                return;
                            }
                            let streamed = stream_put(
                                &conn,
                                &mut stream,
                                &rbuf[start..],
                                head_len,
                                body_len,
                                &mut scratch,
                                &mut wbuf,
                            )
                            .await;
                            // The rest of the buffer was this request's body.
                            rbuf.truncate(start);
                            continue_sent = false;
                            match streamed {
                                None => return,
                                Some(true) => {
                                    close = true;
                                    break;
                                }
                                Some(false) => continue,
                            }
                        }
                        Framed::Malformed(e) => {
                            body_since = None;
                            conn.set(ConnState::Busy);
                            answer_malformed(&front, e, &mut scratch, &mut wbuf);
                            close = true;
                            break;
                        }
                        Framed::Request {
                            head_len,
                            body_end,
                            next,
                            early,
                        } => (head_len, body_end, next, early),
                    };
                conn.set(ConnState::Busy);
                let req = &rbuf[start..start + body_end];
                let Parsed::Complete(head) = parse_head(&req[..head_len]) else {
                    unreachable!("a framed head parses again");
                };
                let verdict = verdict(&front, &head);
                let answered = answer(
                    &front,
                    &mut stream,
                    &head,
                    verdict,
                    req,
                    early,
                    body_since.take(),
                    &mut scratch,
                    &mut wbuf,
                );
                let Some(closes) = answered.await else {
                    return;
                };
                (closes, next)
            };
            close |= closes;
            continue_sent = false;
            start += advance;
            if close {
                break;
            }
            if wbuf.len() >= WRITE_BUF_FLUSH_BYTES && !flush(&mut stream, &mut wbuf).await {
                return;
            }
        }
        if start > 0 {
            rbuf.drain(..start);
        }
        if !wbuf.is_empty() && !flush(&mut stream, &mut wbuf).await {
            return;
        }
        if close {
            linger(&mut stream, fd, rbuf).await;
            return;
        }
        if front.is_draining() && rbuf.is_empty() {
            return;
        }
        // The client waits for our go-ahead before sending a body it announced.
        if !continue_sent && wants_continue(&rbuf, &pending) {
            wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !flush(&mut stream, &mut wbuf).await {
                return;
            }
            continue_sent = true;
        }
        if rbuf.is_empty() {
            conn.set(ConnState::Idle);
            if rbuf.capacity() > READ_BUF_KEEP_BYTES {
                rbuf = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
                charge.settle(rbuf.capacity());
            }
        } else {
            conn.set(ConnState::Reading);
        }
        // Read more, at least a few KiB of room; a known body gets room for all of it.
        let want = match &pending {
            Pending::Length { total, .. } => total.saturating_sub(rbuf.len()),
            _ => 0,
        };
        let needed = want.max(4096);
        if rbuf.capacity() - rbuf.len() < needed {
            // The capacity `reserve` will pick (it doubles, or takes exactly what is needed).
            let grown = (rbuf.capacity() * 2).max(rbuf.len() + needed);
            if !charge.fits(grown) {
                // The shard's connections already hold their budget of buffered requests:
                // shed this one rather than grow memory without bound.
                let resp = {
                    let mut ctx = Ctx {
                        shard: front.shard(),
                        scratch: &mut scratch,
                    };
                    let mut r = ctx.overloaded();
                    r.close = true;
                    r
                };
                front.encode(resp, None, &scratch, &mut wbuf);
                if flush(&mut stream, &mut wbuf).await {
                    linger(&mut stream, fd, rbuf).await;
                }
                return;
            }
            rbuf.reserve(needed);
            charge.settle(rbuf.capacity());
        }
        let len = rbuf.len();
        let (res, slice) = stream.read(rbuf.slice_mut(len..)).await;
        rbuf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
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

/// Closes gracefully after an error answer: stop sending, then read and discard what the
/// client still sends (bounded in bytes and time), so the kernel does not reset the connection
/// and destroy the answer before the client read it.
pub(super) async fn linger<S: Io>(stream: &mut S, fd: RawFd, mut buf: Vec<u8>) {
    // SAFETY: the fd is open for the lifetime of `stream`.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let deadline = std::time::Instant::now() + Duration::from_millis(LINGER_MS);
    let mut discarded = 0;
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
