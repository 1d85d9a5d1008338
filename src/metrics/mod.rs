//! Counters, histograms and their exposition.
//!
//! Statistics are kept per shard ([`ShardStats`], atomics written only by their owner) and
//! summed when read, so recording never contends across cores and a scrape never walks keys.

pub mod bus;
pub mod client;
pub mod counter;
pub mod exposition;
pub mod hdr;
pub mod hist;
pub mod kv_events;
pub mod otlp;
pub mod process;
pub mod requests;
pub mod store;
pub mod trace;
pub mod view;
pub mod window;

pub use counter::{Counter, Gauge};

/// Statistics of one shard's HTTP front end and mailbox. Lives in the shard's
/// `RemoteShard` (`src/shards`), so any thread can read it.
#[derive(Default, Debug)]
pub struct ShardStats {
    pub http_requests: Counter,
    /// Responses by status class: index 0 is 1xx ... index 4 is 5xx.
    pub http_responses: [Counter; 5],
    pub connections_accepted: Counter,
    pub connections_open: Gauge,
    /// Connections refused at accept because the shard was at its connection limit.
    pub connections_rejected: Counter,
    /// Connections closed by the housekeeping tick (idle or header timeout).
    pub connections_timed_out: Counter,
    /// Requests this shard sent to another shard (the key's owner).
    pub cross_shard_requests: Counter,
    /// Requests answered 429 because a shard inbox or the outstanding limit was full.
    pub overload_rejections: Counter,
    /// TLS handshakes that failed or timed out (bad or missing client certificates).
    pub tls_handshake_failures: Counter,
    /// Write or move grants refused because a request under them was served already.
    pub grants_refused_used: Counter,
    /// Write or move grants refused (503) because the ledger of used grants was full.
    pub grants_refused_ledger_full: Counter,
    /// Read-buffer bytes beyond the initial buffer that this shard's connections hold.
    pub buffered_bytes: Gauge,
    pub metadata_keys: Gauge,
    pub metadata_bytes: Gauge,
    /// The same-host data path (`http::same_host`): puts whose bytes were read from a client's
    /// memory and gets whose bytes were written into it, their bytes, the copies that failed,
    /// and the large copies made in two halves (`same_host_halves_taken_back`: first halves the
    /// shard made itself, its copy helper not having started them), the copies made through
    /// buffers clients share and the offers of such buffers refused.
    pub same_host: SameHostStats,
    /// Request latencies per operation (`memcache_http_request_duration_seconds`).
    pub request_durations: requests::RequestDurations,
}

/// See [`ShardStats::same_host`].
#[derive(Default, Debug)]
pub struct SameHostStats {
    pub puts: Counter,
    pub put_bytes: Counter,
    pub gets: Counter,
    pub get_bytes: Counter,
    pub copy_failures: Counter,
    pub split_copies: Counter,
    pub halves_taken_back: Counter,
    /// Copies made with `memcpy` through buffers a client shares (`X-Mmc-Shared`).
    pub shared_copies: Counter,
    /// `X-Mmc-Shared` offers refused (not a sealed memfd, not the file named, …).
    pub shared_refusals: Counter,
    /// Gets answered with the blobs' places in segments the client maps (`X-Mmc-Mapped`):
    /// the client copied them (also counted in `gets`).
    pub mapped_gets: Counter,
    /// Mapped answers whose blobs' pins same-host connections hold now, and their bytes (the
    /// client copying, or not done yet: pinned blobs are not freed or evicted).
    pub held_answers: Gauge,
    pub held_bytes: Gauge,
}

impl ShardStats {
    #[inline]
    pub fn count_response(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.http_responses[class].inc();
    }
}
