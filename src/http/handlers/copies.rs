//! Copies of an object's bytes from a copy on one rank into a new blob on another, through
//! this meta service: a drain's moves off a leaving rank (`cluster.rs`) and re-replication
//! ([`HttpCopier`], which the shards' re-replication tasks call). The store allocated the new
//! blob (ALLOCATED, pinned for the copy alone) and keeps the source from being freed; the
//! bytes are read from this process's memory or SSD, or fetched from the source's local
//! service under a read grant, and written into this process's memory or to the
//! destination's local service under a write grant (which catalogs them there with the
//! object's stamp).

use super::remote::{self, HOP_TIMEOUT};
use crate::cluster::catalog::{Floors, Stamp};
use crate::http::client;
use crate::shards::store::BlobView;
use crate::shards::store::segment::Medium;
use crate::shards::{ObjectCopier, Shard};

/// Copies the object `key`'s bytes from `from` into `to`; true when `to` holds them.
/// `floors`: the freed logs' sequences taken before `to` was allocated (`remote::copy_floor`).
pub(super) async fn copy(
    shard: &Shard,
    key: &[u8],
    from: &BlobView,
    to: &BlobView,
    stamp: Stamp,
    floors: &Floors,
) -> bool {
    let floor = remote::copy_floor(floors, to);
    match fetch(shard, key, from).await {
        Some(bytes) => write(shard, key, to, stamp, floor, bytes).await,
        None => false,
    }
}

/// The object's bytes at `from`: read here, or fetched from its local service. `None` when
/// they could not be had whole (an SSD copy that fails its checksum included).
async fn fetch(shard: &Shard, key: &[u8], from: &BlobView) -> Option<Vec<u8>> {
    let name = || String::from_utf8_lossy(key).into_owned();
    if from.seg.backend.remote().is_none() {
        if from.seg.medium == Medium::Ssd {
            let read = shard.read_ssd_checked(from.seg.arc(), from.offset, from.len, from.sum);
            return match read.await {
                Ok(bytes) => Some(bytes),
                Err(outcome) => {
                    log::warn!("copying {:?}: its SSD copy read {outcome:?}", name());
                    None
                }
            };
        }
        let mut bytes = vec![0u8; from.len as usize];
        // SAFETY: the source blob is kept (pinned) until the copy ends.
        return match unsafe { from.seg.backend.read(from.offset, &mut bytes) } {
            Ok(()) => Some(bytes),
            Err(e) => {
                log::warn!("copying {:?}: reading {}: {e}", name(), from.seg.name);
                None
            }
        };
    }
    let url = remote::read_grant_url(&shard.shared, key, from)?;
    match client::request_url(&url, "GET", Vec::new(), HOP_TIMEOUT).await {
        // Object bytes only: a damaged SSD copy answers an error envelope, never copied.
        Ok(a) if a.status == 200 && a.octet_stream && a.body.len() as u64 == from.len => {
            Some(a.body)
        }
        Ok(a) => {
            log::warn!("copying {:?}: its rank answered {}", name(), a.status);
            None
        }
        Err(e) => {
            log::warn!("copying {:?}: {e}", name());
            None
        }
    }
}

/// Writes the object's bytes into the new blob `to`: here directly, or on its local service
/// under a write grant (answered with success).
async fn write(
    shard: &Shard,
    key: &[u8],
    to: &BlobView,
    stamp: Stamp,
    floor: u64,
    bytes: Vec<u8>,
) -> bool {
    if to.seg.backend.remote().is_none() {
        // SAFETY: the new blob is ALLOCATED and pinned for this copy alone until it ends.
        return unsafe { to.seg.backend.write(to.offset, &bytes) }.is_ok();
    }
    let Some(url) = remote::write_grant_url(&shard.shared, key, to, stamp, floor) else {
        return false;
    };
    match client::request_url(&url, "PUT", bytes, HOP_TIMEOUT).await {
        Ok(a) if a.status == 200 => {
            let answer: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
            answer["success"] == true
        }
        Ok(a) => {
            log::warn!(
                "copying {:?}: rank {} answered {}",
                String::from_utf8_lossy(key),
                to.seg.rank,
                a.status
            );
            false
        }
        Err(e) => {
            log::warn!("copying {:?}: {e}", String::from_utf8_lossy(key));
            false
        }
    }
}

/// The shards' way of copying an object to another rank (re-replication).
pub struct HttpCopier;

impl ObjectCopier for HttpCopier {
    fn copy<'a>(
        &'a self,
        shard: &'a Shard,
        key: &'a [u8],
        from: &'a BlobView,
        to: &'a BlobView,
        stamp: Stamp,
        floors: &'a Floors,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>> {
        Box::pin(copy(shard, key, from, to, stamp, floors))
    }
}
