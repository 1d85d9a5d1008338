//! Framing: finds the next complete request at the start of the unprocessed bytes (its head,
//! where its body ends, where the next request starts), decoding chunked bodies in place and
//! deciding early answers (413, or answering before an unneeded body arrived).

use crate::http::Front;
use crate::http::chunked::{ChunkedDecoder, Progress};
use crate::http::handlers;
use crate::http::parse::{Framing, Head, Method, Parsed, ProtocolError, parse_head};
use crate::http::response::Status;
use crate::http::router::{self, Route};

/// Body framing in progress for the request at the start of the read buffer.
pub(super) enum Pending {
    None,
    /// Waiting until the buffer holds `total` bytes (head plus body).
    Length {
        head_len: usize,
        total: usize,
        /// The head asked for `100 Continue` (kept from its one parse).
        expect_continue: bool,
    },
    /// Decoding chunks in place: decoded body bytes end at `write`, undecoded input starts at
    /// `read` (both offsets from the request start; `head_len <= write <= read`).
    Chunked {
        dec: ChunkedDecoder,
        head_len: usize,
        write: usize,
        read: usize,
        expect_continue: bool,
    },
}

/// What the framing step found at the start of the unprocessed bytes.
pub(super) enum Framed {
    NeedMore,
    /// No usable head: answer with this error and close.
    Malformed(ProtocolError),
    /// A head (and its body, unless `early` says otherwise). The next request starts at
    /// `next` (offsets from the request start).
    Request {
        head_len: usize,
        body_end: usize,
        next: usize,
        early: Option<Early>,
    },
    /// A complete head whose large body is still arriving and goes straight to its
    /// destination ([`handlers::streams_body`]): everything after the head in the buffer is
    /// the start of that body.
    Stream {
        head_len: usize,
        body_len: usize,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Early {
    /// The body is over its limit: answer 413 and close without reading it.
    TooLarge,
    /// The answer does not need the body (404, 405, ...), which has not fully arrived:
    /// answer now and close.
    BodyNotRead,
}

/// How a head is dispatched before any handler runs.
pub(super) enum Verdict {
    Dispatch(Route),
    NotFound,
    MethodNotAllowed(Route),
    Options(Option<Route>),
    Unauthorized,
    /// HA on and this node is not the serving leader: the route is answered by the leader
    /// (a 307 to it) or, with no leader known, 503.
    NotLeader,
}

impl Verdict {
    /// The route the request is dispatched to, if it is.
    #[inline]
    pub(super) fn dispatched(&self) -> Option<Route> {
        match self {
            Verdict::Dispatch(route) => Some(*route),
            _ => None,
        }
    }
}

/// The most body bytes a request may carry: its route's limit, or the general one when it
/// will not be dispatched.
pub(super) fn body_limit_for(front: &Front, head: &Head<'_>, verdict: &Verdict) -> u64 {
    match verdict {
        Verdict::Dispatch(route) => handlers::body_limit(*route, head.method, front.config()),
        _ => front.config().http.max_body_bytes,
    }
}

pub(super) fn verdict(front: &Front, head: &Head<'_>) -> Verdict {
    if !front.auth().allows(head) {
        return Verdict::Unauthorized;
    }
    if head.path == b"*" {
        return Verdict::Options(None);
    }
    match router::lookup(head.path) {
        None => Verdict::NotFound,
        Some(route) if !route.allows(head.method) => Verdict::MethodNotAllowed(route),
        Some(route) if head.method == Method::Options => Verdict::Options(Some(route)),
        // With HA off this is one load of a plain bool (`HaView::gated`).
        Some(route) if front.ha().gated() && !route.served_by_standby() => Verdict::NotLeader,
        Some(route) => Verdict::Dispatch(route),
    }
}

/// A request whose head and whole body are in `buf`, needing no early answer: its head, total
/// length and verdict (computed once, for the body limit and for [`dispatch`]). `None` leaves
/// the decision to [`frame`].
pub(super) fn complete_request<'b>(
    front: &Front,
    buf: &'b [u8],
) -> Option<(Head<'b>, usize, Verdict)> {
    let Parsed::Complete(head) = parse_head(buf) else {
        return None;
    };
    let total = match head.framing {
        Framing::None => head.len,
        Framing::Length(n) => {
            let total = head.len.checked_add(usize::try_from(n).ok()?)?;
            if total > buf.len() {
                return None;
            }
            total
        }
        Framing::Chunked => return None,
    };
    let verdict = verdict(front, &head);
    if let Framing::Length(n) = head.framing
        && n > body_limit_for(front, &head, &verdict)
    {
        return None;
    }
    Some((head, total, verdict))
}

/// Decides whether a complete request sits at `rbuf[start..]`, advancing body framing.
pub(super) fn frame(
    front: &Front,
    rbuf: &mut Vec<u8>,
    start: usize,
    pending: &mut Pending,
) -> Framed {
    loop {
        let avail = rbuf.len() - start;
        match pending {
            Pending::Length {
                head_len, total, ..
            } => {
                let (head_len, total) = (*head_len, *total);
                if avail < total {
                    return Framed::NeedMore;
                }
                *pending = Pending::None;
                return request(head_len, total, None);
            }
            Pending::Chunked { .. } => return frame_chunked(rbuf, start, pending),
            Pending::None => {
                if avail == 0 {
                    return Framed::NeedMore;
                }
                match frame_head(front, &rbuf[start..], pending) {
                    Some(framed) => return framed,
                    // Chunked: loop once more to decode whatever already arrived.
                    None => continue,
                }
            }
        }
    }
}

/// A request whose body ends at `end` (also where the next request starts).
fn request(head_len: usize, end: usize, early: Option<Early>) -> Framed {
    Framed::Request {
        head_len,
        body_end: end,
        next: end,
        early,
    }
}

/// Decodes the chunks that arrived of the body in `pending` (a `Pending::Chunked`).
fn frame_chunked(rbuf: &mut Vec<u8>, start: usize, pending: &mut Pending) -> Framed {
    let Pending::Chunked {
        dec,
        head_len,
        write,
        read,
        ..
    } = pending
    else {
        unreachable!("called for a chunked body");
    };
    let head_len = *head_len;
    let region = &mut rbuf[start..];
    let mut w = *write;
    let mut r = *read;
    let progress = dec.decode_in_place(region, &mut w, &mut r);
    // Drop the consumed chunk framing so the buffer holds head, decoded body, then undecoded
    // input.
    rbuf.drain(start + w..start + r);
    *write = w;
    *read = w;
    match progress {
        Ok(Progress::NeedMore) => Framed::NeedMore,
        Err(e) if e.status == Status::PAYLOAD_TOO_LARGE => {
            *pending = Pending::None;
            request(head_len, head_len, Some(Early::TooLarge))
        }
        Err(e) => {
            *pending = Pending::None;
            Framed::Malformed(e)
        }
        Ok(Progress::Done) => {
            *pending = Pending::None;
            request(head_len, w, None)
        }
    }
}

/// Frames a new request's head at the start of `buf`. `None`: a chunked body starts, now
/// in `pending`.
fn frame_head(front: &Front, buf: &[u8], pending: &mut Pending) -> Option<Framed> {
    let head = match parse_head(buf) {
        Parsed::Complete(h) => h,
        Parsed::Partial => return Some(Framed::NeedMore),
        Parsed::Error(e) => return Some(Framed::Malformed(e)),
    };
    let head_len = head.len;
    let verdict = verdict(front, &head);
    let limit = body_limit_for(front, &head, &verdict);
    let route = verdict.dispatched();
    let n = match head.framing {
        Framing::None => return Some(request(head_len, head_len, None)),
        Framing::Length(n) if n > limit => {
            return Some(request(head_len, head_len, Some(Early::TooLarge)));
        }
        Framing::Length(n) => n,
        Framing::Chunked => {
            *pending = Pending::Chunked {
                dec: ChunkedDecoder::new(limit),
                head_len,
                write: head_len,
                read: head_len,
                expect_continue: head.expect_continue,
            };
            return None;
        }
    };
    let total = head_len + n as usize;
    Some(if buf.len() >= total {
        request(head_len, total, None)
    } else if route.is_none() {
        request(head_len, head_len, Some(Early::BodyNotRead))
    } else if route.is_some_and(|r| {
        handlers::streams_body(r, head.method, n)
            || (head.expect_continue && handlers::streams_body(r, head.method, u64::MAX) && n > 0)
    }) {
        // Large bodies, and any put whose client waits for `100 Continue`: the owner decides
        // before a byte of the body is read (a remote rank's put is redirected with a 307 the
        // client gets instead of the go-ahead, so its body crosses once, to the local service).
        Framed::Stream {
            head_len,
            body_len: n as usize,
        }
    } else {
        *pending = Pending::Length {
            head_len,
            total,
            expect_continue: head.expect_continue,
        };
        Framed::NeedMore
    })
}

/// Whether the request at the start of the buffer announced `Expect: 100-continue` and is
/// waiting for its body.
pub(super) fn wants_continue(pending: &Pending) -> bool {
    match pending {
        Pending::None => false,
        Pending::Length {
            expect_continue, ..
        }
        | Pending::Chunked {
            expect_continue, ..
        } => *expect_continue,
    }
}
