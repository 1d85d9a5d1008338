//! A remote rank's segment backend: where its local service answers. The store allocates a
//! remote segment's ranges like any other's; the bytes are on that service.

/// Where a remote rank's local service answers.
#[derive(Debug, Clone)]
pub struct RemoteRank {
    /// Its data-plane base URL, `http://host:port`.
    pub url: String,
}

/// The error of a byte access the meta service cannot make itself.
pub(super) fn remote_bytes() -> std::io::Error {
    std::io::Error::other("a remote rank's bytes are on its local service")
}
