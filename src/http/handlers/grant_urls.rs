//! The grants a meta service gives for a remote blob's transfers that it makes or sends a
//! client to make outside a put's chain: a read (a get's redirect, a copy's fetch), a copy's
//! write (a drain's move, a re-replication: with the destination log's floor), and the fields
//! of any grant on one blob (`tier.rs`'s moves).

use super::remote::object_url;
use crate::cluster::catalog::{Floors, Stamp};
use crate::grant::{Grant, GrantOp, unix_ms};
use crate::shards::Shared;
use crate::shards::store::BlobView;

pub(super) fn read_grant_url(shared: &Shared, key: &[u8], v: &BlobView) -> Option<String> {
    let config = &shared.config;
    let ttl = config.grant_ttl_ms().min(config.store.lease_ms.max(1));
    grant_url(key, v, GrantOp::Read, ttl, Stamp::default(), 0)
}

/// A write-only grant URL for a blob on a remote rank (a copy from another rank writes
/// there: a drain's move, a re-replication), carrying the object's stamp for the local
/// service's catalog.
pub(super) fn write_grant_url(
    shared: &Shared,
    key: &[u8],
    v: &BlobView,
    stamp: Stamp,
    floor: u64,
) -> Option<String> {
    grant_url(
        key,
        v,
        GrantOp::Write,
        shared.config.grant_ttl_ms(),
        stamp,
        floor,
    )
}

/// The floor of a copy's write grant into the remote blob `v` ([`Grant::floor`]), from the
/// logs' sequences `floors` taken before `v` was allocated ([`FreedLogs::floors`]): the
/// records noted before (an earlier attempt at this copy, given up, names the same range and
/// stamp) must not drop the entry the write makes, and every record of a removal of the
/// object since is above it, which the local service then holds against the late write.
/// Found by the cluster simulation, seed 76991: taken after the fetch, the floor shielded the
/// write from the removal's record and the deleted object came back with that catalog; and
/// taken when the copy began, a removal between the drain's allocation and the copy's turn
/// would have done the same.
///
/// [`FreedLogs::floors`]: crate::cluster::catalog::FreedLogs::floors
pub(super) fn copy_floor(floors: &Floors, v: &BlobView) -> u64 {
    v.seg
        .backend
        .remote()
        .map_or(0, |r| floors.of(v.seg.rank, r.epoch))
}

/// The URL of one transfer of a remote blob's bytes on its local service, valid `ttl_ms`,
/// with `floor` ([`Grant::floor`]).
fn grant_url(
    key: &[u8],
    v: &BlobView,
    op: GrantOp,
    ttl_ms: u64,
    stamp: Stamp,
    floor: u64,
) -> Option<String> {
    let remote = v.seg.backend.remote()?;
    let grant = Grant {
        floor,
        ..blob_grant(op, v, stamp, unix_ms() + ttl_ms, v.sum)
    };
    let text = grant.sign(&remote.grant_key, key, b"");
    Some(object_url(&remote.url, key, &text, None))
}

/// A grant of `op` on the blob `v` names (its rank, medium and range; its length is the
/// object's size), for the object with `stamp`, carrying the checksum `sum`.
pub(super) fn blob_grant(
    op: GrantOp,
    v: &BlobView,
    stamp: Stamp,
    expires_ms: u64,
    sum: u64,
) -> Grant {
    Grant {
        op,
        rank: v.seg.rank,
        medium: v.seg.medium as u8,
        offset: v.offset,
        len: v.len,
        size: v.len,
        obj_id: 0,
        obj_generation: stamp.seq,
        view: stamp.view,
        expires_ms,
        sum,
        floor: 0,
    }
}
