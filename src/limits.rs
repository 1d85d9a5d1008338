//! Fixed protocol limits, kept together so that each number carries its reason.
//!
//! Limits an operator may want to tune live in the configuration (`crate::config`); the ones
//! here are part of the wire contract (the statuses that enforce them are fixed by the design)
//! or protect the process from a single hostile peer.

/// Largest request head (request line plus headers plus the blank line). A larger head is
/// answered with 431. 16 KiB is what nginx and most proxies accept by default, so a request
/// that passed a proxy in front of us also passes here.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Longest request target (path plus query). A longer one is answered with 414. Keys travel in
/// the query string, and 8 KiB leaves room for a batch of long keys while bounding the work of
/// decoding one request line.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most header fields in one request (431 beyond). Real clients send fewer than 20.
pub const MAX_HEADERS: usize = 64;

/// Longest key accepted by `/metadata` and the object routes. Longer keys are a business error.
/// Upstream keys are short (an LMCache key is ~100 bytes); 4 KiB bounds the per-entry overhead
/// an attacker can force while leaving room for any real naming scheme.
pub const MAX_KEY_BYTES: usize = 4096;

/// Longest `X-Request-ID` we echo. Longer or non-printable ids are replaced by a generated one,
/// so a client cannot inject header bytes or bloat every response.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Longest chunk-size line (hex size plus extensions) in a chunked body; a longer one is a
/// malformed request (400). Real clients send a handful of bytes.
pub const MAX_CHUNK_LINE_BYTES: usize = 1024;

/// Largest trailer section after the last chunk (431 beyond, like the head).
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Initial read buffer of a connection: one small request (a few hundred bytes; a pipelined
/// burst of 32 GETs is about 3 KiB) fits without growth, and an idle connection holds little
/// (perf/RESULTS.md, issue 33: 8 KiB made 15.5 KiB per idle connection).
pub const READ_BUF_INITIAL_BYTES: usize = 4 * 1024;

/// A read buffer grown past this by a large body is dropped and reallocated at the initial size
/// once the request is done, so an idle connection never pins megabytes.
pub const READ_BUF_KEEP_BYTES: usize = 256 * 1024;

/// A single-object put with a body at least this large is streamed from the socket into its
/// blobs as it arrives (no read buffer the size of the body, one copy fewer for host memory);
/// smaller bodies are buffered, which costs less than the extra round of the alloc first.
pub const STREAM_BODY_MIN_BYTES: u64 = 256 * 1024;

/// Staging buffer of a streamed body on its way into device memory (or several replicas), and
/// of a body read only to be dropped.
pub const STAGING_BYTES: usize = 1024 * 1024;

/// Staging buffers a shard keeps for reuse (16 MiB at most, only once device-memory traffic
/// used them): more transfers through staging at once than this allocate extra buffers, freed
/// after use.
pub const STAGING_POOL_BUFFERS: usize = 16;

/// Pending response bytes after which the connection writes before parsing more pipelined
/// requests, so a client that pipelines thousands of requests cannot grow our buffer unbounded.
pub const WRITE_BUF_FLUSH_BYTES: usize = 64 * 1024;

/// After an error response that closes the connection (e.g. 413 before the body was read), we
/// keep reading and discarding this much for up to `LINGER_MS`, so the kernel does not reset the
/// connection (and destroy our response) while the client is still sending.
pub const LINGER_DISCARD_BYTES: usize = 1024 * 1024;
pub const LINGER_MS: u64 = 2000;

/// Period of each shard's housekeeping tick: refreshes the cached clock and `Date` header and
/// closes connections past their idle or header timeout. Timeouts are therefore precise to this.
pub const TICK_MS: u64 = 250;

/// Write and move grants a process remembers as used (`grant::GrantLedger`), each until its
/// expiry: a second request under one is refused, 403. Every entry is live for at most
/// `ock.mmc.cluster.grant_ttl_ms` (10 s by default), so 2^20 entries (about 60 MiB at the
/// bound, a hash entry and a heap entry each) cover a sustained 100k writes per second to one
/// local service at that TTL. Past it a write is refused 503 with `Retry-After` until grants
/// expire: forgetting a live one early would let it be replayed.
pub const MAX_USED_GRANTS: usize = 1 << 20;

/// How long a hop of the cluster's own messages waits for its answer (a chain's next hop, a
/// commit with the meta service, a tier move after its grants' TTL).
pub const HOP_TIMEOUT_MS: u64 = 10_000;

/// The difference between two hosts' wall clocks that grants allow for: a local service
/// checks a grant's expiry (the meta's clock) against its own. NTP keeps hosts within
/// milliseconds; this is the margin the meta adds before it reuses a range a remote writer
/// could still reach.
pub const CLOCK_SKEW_MS: u64 = 2_000;

/// A local service maps a same-host read under a meta's grant only while the grant has this
/// long left (the client's copy, microseconds to milliseconds, must end within it).
pub const MAPPED_GRANT_MIN_LEFT_MS: u64 = 250;
