//! A connection's side of the same-host data path (`http::same_host`): a put whose bytes the
//! server reads from the client's memory into the granted blobs, and a get's blobs written
//! into the client's memory while the answer (and so its lease and pins) is held. Everything
//! else about the request (routing, auth, grants, leases, commit) is the TCP path's.

use super::body_io::staging;
use crate::http::handlers::{self, Ctx, Filled, Request};
use crate::http::response::{Body, Part, Response, SameHost, Status};
use crate::http::same_host::{LocalPeer, sub_iov, total};
use crate::limits::STAGING_BYTES;
use crate::shards::WriteGrant;

/// `PUT /api/v1/objects` with `X-Mmc-Iov`: the object is the bytes at `iov` in the peer's
/// memory (the request carries no body). Through `put_streamed`, as a streamed TCP body: the
/// owner allocates, the bytes are copied into the grant's blobs, the commit makes them
/// readable. A copy that fails (the client exited, an address is not its) aborts the
/// allocation: nothing of it is ever readable.
pub(super) async fn put(
    peer: &LocalPeer,
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    iov: &[libc::iovec],
) -> Response {
    let size = total(iov).unwrap_or(u64::MAX);
    if !req.body.is_empty() {
        return ctx.protocol_error(
            Status::BAD_REQUEST,
            "Bad request: a put with X-Mmc-Iov carries no body",
        );
    }
    if size > ctx.shard.shared.config.http.max_body_bytes {
        let message = handlers::body_limit_message(
            Some(req.route),
            req.head.method,
            &ctx.shard.shared.config,
        );
        return ctx.protocol_error(Status::PAYLOAD_TOO_LARGE, &message);
    }
    let fill = async |grant: Option<&WriteGrant>| match grant {
        // Refused before allocating: there is no body to consume.
        None => Filled::Ok,
        Some(grant) => fill_from_peer(peer, grant, iov, size as usize),
    };
    let resp = match handlers::put_streamed(req, ctx, size, fill).await {
        Some(resp) => resp,
        None => copy_failed(ctx),
    };
    let stats = &ctx.shard.stats().same_host;
    if resp.status == Status::OK {
        stats.puts.inc();
        stats.put_bytes.add(size);
    }
    count_splits(ctx, peer);
    resp
}

/// Adds the large copies `peer`'s request split (and the halves taken back), and those made
/// through shared buffers, to the shard's statistics.
fn count_splits(ctx: &Ctx<'_>, peer: &LocalPeer) {
    let splits = peer.take_splits();
    if splits != Default::default() {
        let stats = &ctx.shard.stats().same_host;
        stats.split_copies.add(splits.split);
        stats.halves_taken_back.add(splits.taken_back);
        stats.shared_copies.add(splits.shared);
    }
}

/// The answer when the client's memory could not be read or written; the connection closes.
fn copy_failed(ctx: &mut Ctx<'_>) -> Response {
    ctx.shard.stats().same_host.copy_failures.inc();
    let mut r = ctx.protocol_error(
        Status::BAD_REQUEST,
        "Bad request: the same-host copy failed (the client's memory named by X-Mmc-Iov could not be copied)",
    );
    r.close = true;
    r
}

/// Copies the peer's bytes into every blob of `grant`: straight into the first blob that is
/// host-addressable, then from there into the others; through a staging buffer when no blob
/// is. `Broken` when the peer's memory could not be read (the grant is then dropped, which
/// aborts the allocation).
fn fill_from_peer(
    peer: &LocalPeer,
    grant: &WriteGrant,
    iov: &[libc::iovec],
    size: usize,
) -> Filled {
    if grant.is_revoked() {
        // The key was removed meanwhile: the commit will say so.
        return Filled::Ok;
    }
    let first = grant.blobs.iter().find_map(|b| {
        let region = b.seg.backend.addressable()?;
        region.check(b.offset, size).ok()?;
        Some((region.ptr(b.offset), b))
    });
    match first {
        Some((dst, from)) => {
            // SAFETY: the blob is this grant's until it ends (the grant outlives the call),
            // and within its region (checked).
            if unsafe { peer.read(iov, dst, size) }.is_err() {
                return Filled::Broken;
            }
            for b in grant.blobs.iter().filter(|b| !std::ptr::eq(*b, from)) {
                // SAFETY: `dst` holds `size` bytes of this grant's first blob, written above
                // and not written again; `b` is another blob of the grant.
                let data = unsafe { std::slice::from_raw_parts(dst, size) };
                if let Err(e) = unsafe { b.seg.backend.write(b.offset, data) } {
                    return Filled::SegmentError(e);
                }
            }
        }
        None => {
            let mut buf = staging::take();
            let mut done = 0;
            while done < size {
                let n = STAGING_BYTES.min(size - done);
                buf.resize(n, 0);
                let part = sub_iov(iov, done, n);
                // SAFETY: `buf` holds `n` bytes.
                if unsafe { peer.read(&part, buf.as_mut_ptr(), n) }.is_err() {
                    return Filled::Broken;
                }
                for b in &grant.blobs[..] {
                    // SAFETY: the blob is this grant's until it ends.
                    if let Err(e) = unsafe { b.seg.backend.write(b.offset + done as u64, &buf) } {
                        return Filled::SegmentError(e);
                    }
                }
                done += n;
            }
            staging::give(buf);
        }
    }
    // The client closes its connection before it gives its buffer back to its caller (a
    // timeout): still open now, after the copy, means the buffer was not refilled while it
    // was read. Closed means it may have been: nothing of the put is kept.
    if peer.hung_up() {
        return Filled::Broken;
    }
    grant.wrote(size as u64);
    Filled::Ok
}

/// The length and the parts of a get's answer when it is the object's bytes (200, blobs and
/// bytes) of exactly the length `iov` names (`up_to`: at most that length); `None` for any
/// other answer.
fn fitting_len<'r>(
    resp: &'r Response,
    iov: &[libc::iovec],
    up_to: bool,
) -> Option<(usize, &'r [Part])> {
    let Body::Parts(parts) = &resp.body else {
        return None;
    };
    let len: usize = parts.iter().map(Part::len).sum();
    let room = total(iov).unwrap_or(0);
    let fits = if up_to {
        len as u64 <= room
    } else {
        len as u64 == room
    };
    (resp.status == Status::OK && fits).then_some((len, parts))
}

/// A get's answer with `X-Mmc-Iov`: when it is the object's bytes (200, blobs and bytes) of
/// exactly the length `iov` names (`up_to`: of at most that length, into its first bytes),
/// they are written into the peer's memory now, while `resp` still holds their lease and
/// pins, and the answer becomes an empty body with `X-Mmc-Delivered: LENGTH`. Any other
/// answer (an error, another length) goes out as usual, on the socket. The copy failing is
/// the answer's failure.
pub(super) fn deliver(
    peer: &LocalPeer,
    iov: &[libc::iovec],
    up_to: bool,
    ctx: &mut Ctx<'_>,
    resp: &mut Response,
) {
    let Some((len, parts)) = fitting_len(resp, iov, up_to) else {
        return;
    };
    let mut at = 0;
    // Part after part, stopping at the first that fails.
    let copied = parts.iter().all(|part| {
        let n = part.len();
        let to = sub_iov(iov, at, n);
        at += n;
        match part {
            Part::Bytes(b) => {
                // SAFETY: `b` is `n` readable bytes, shared and never written.
                unsafe { peer.write(&to, b.as_ptr(), n) }.is_ok()
            }
            Part::Blob(p) => write_blob(peer, &to, p),
        }
    });
    count_splits(ctx, peer);
    if !copied {
        *resp = copy_failed(ctx);
        return;
    }
    let stats = &ctx.shard.stats().same_host;
    stats.gets.inc();
    stats.get_bytes.add(len as u64);
    // The pins and the lease's hold end here, after the copy; the answer says how much.
    resp.body = Body::Omitted(len as u64);
    resp.same_host = SameHost::Delivered;
}

/// A get asked for with `X-Mmc-Map`: when every blob of the answer is pinned here in a DRAM
/// segment on a memfd, the answer names where they are (`X-Mmc-Mapped`) instead of copying
/// them, and the connection holds their pins (the read's lease) until the client says it is
/// done (`X-Mmc-Map: N` on a later request) or the connection closes: the client copies from
/// its read-only mapping of the segment. On a local service, blobs read under a meta's grant
/// are mapped too, the grant's expiry added to the answer (`shards::grant_reads`). Returns
/// false (nothing changed) when the answer cannot be mapped: the caller copies it as before.
pub(super) fn map(
    peer: &LocalPeer,
    iov: &[libc::iovec],
    up_to: bool,
    ctx: &mut Ctx<'_>,
    resp: &mut Response,
) -> bool {
    use std::fmt::Write;
    use std::os::fd::AsRawFd;
    let Some((len, parts)) = fitting_len(resp, iov, up_to) else {
        return false;
    };
    if peer.held() >= crate::http::same_host::MAX_HELD_LEASES || peer.copies_faster(iov, len) {
        return false;
    }
    let mut places = String::new();
    // For bytes read under a meta's grant (on a local service): when the client's copy must
    // have ended, the earliest of their grants' expiries.
    let mut until: Option<u64> = None;
    for part in parts {
        let Part::Blob(p) = part else { return false };
        let v = &p.view;
        let file = v.seg.backend.addressable().and_then(|r| {
            r.check(v.offset, v.len as usize).ok()?;
            r.shared_file()
        });
        let Some(file) = file else {
            return false;
        };
        if let Some(g) = p.granted() {
            // Nothing here pins them: the meta's lease holds the range until the grant's
            // expiry (by this host's clock, which the client reads too), and a join of this
            // service shuts the connection down before the range can change otherwise.
            let left = g.until_ms.saturating_sub(crate::grant::unix_ms());
            if left < crate::limits::MAPPED_GRANT_MIN_LEFT_MS
                || !peer.may_hold_granted(&ctx.shard.shared, g.epoch)
            {
                return false;
            }
            until = Some(until.map_or(g.until_ms, |u| u.min(g.until_ms)));
        }
        let sep = if places.is_empty() { "" } else { "," };
        let _ = write!(
            places,
            "{sep}{}:{}:{}:{}",
            file.fd.as_raw_fd(),
            file.ino,
            v.offset,
            v.len
        );
    }
    let Body::Parts(parts) = std::mem::replace(&mut resp.body, Body::Omitted(len as u64)) else {
        unreachable!("matched above");
    };
    match peer.hold(parts) {
        Ok(lease) => {
            resp.location = Some(
                match until {
                    Some(until) => format!("{lease} {places} {until}"),
                    None => format!("{lease} {places}"),
                }
                .into_boxed_str(),
            );
            resp.same_host = SameHost::Mapped;
            let stats = &ctx.shard.stats().same_host;
            stats.gets.inc();
            stats.get_bytes.add(len as u64);
            stats.mapped_gets.inc();
            true
        }
        Err(parts) => {
            resp.body = Body::Parts(parts);
            false
        }
    }
}

/// A pinned blob's bytes into the peer's memory at `to`.
fn write_blob(peer: &LocalPeer, to: &[libc::iovec], p: &crate::shards::PinnedBlob) -> bool {
    let v = &p.view;
    let len = v.len as usize;
    if let Some(region) = v.seg.backend.addressable() {
        if region.check(v.offset, len).is_err() {
            return false;
        }
        // SAFETY: the blob is pinned (readable, never written) while `p` lives, which is
        // for the whole call.
        return unsafe { peer.write(to, region.ptr(v.offset), len) }.is_ok();
    }
    let mut buf = staging::take();
    let mut done = 0;
    while done < len {
        let n = STAGING_BYTES.min(len - done);
        buf.resize(n, 0);
        // SAFETY: as above.
        if unsafe { v.seg.backend.read(v.offset + done as u64, &mut buf) }.is_err()
            || unsafe { peer.write(&sub_iov(to, done, n), buf.as_ptr(), n) }.is_err()
        {
            return false;
        }
        done += n;
    }
    staging::give(buf);
    true
}
