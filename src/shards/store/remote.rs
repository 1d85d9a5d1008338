//! A remote rank's segment backend: where its local service answers. The store allocates a
//! remote segment's ranges like any other's; the bytes are on that service.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use crate::grant::GrantKey;

/// Where a remote rank's local service answers.
#[derive(Debug)]
pub struct RemoteRank {
    /// Its data-plane base URL, `http://host:port`.
    pub url: String,
    /// The key the grants on this rank's blobs are signed with: its local service's own,
    /// for the incarnation and membership that joined ([`crate::grant::GrantKey::for_member`]).
    pub grant_key: Arc<GrantKey>,
    /// The membership that mounted this segment (`cluster::members`: the epoch its join was
    /// answered with): dropping that membership drops exactly its segments.
    pub epoch: u64,
    /// An SSD segment's disk status as the local service last reported it (0 normal, else
    /// the errno of its file's fault): a faulted remote SSD takes no flushes, as a local one.
    disk_status: AtomicU8,
}

impl RemoteRank {
    pub fn new(url: String, grant_key: GrantKey, epoch: u64) -> RemoteRank {
        RemoteRank {
            url,
            grant_key: Arc::new(grant_key),
            epoch,
            disk_status: AtomicU8::new(0),
        }
    }

    /// The disk status from the rank's last report (`memcache_ubs_io_disk_status`).
    pub fn disk_status(&self) -> u8 {
        self.disk_status.load(Relaxed)
    }

    pub fn set_disk_status(&self, status: u8) {
        self.disk_status.store(status, Relaxed);
    }
}

/// The error of a byte access the meta service cannot make itself.
pub(super) fn remote_bytes() -> std::io::Error {
    std::io::Error::other("a remote rank's bytes are on its local service")
}
