//! Request latency per operation: the `memcache_http_request_duration_seconds` histogram
//! family. Each shard records the requests it answers into its own fixed buckets (single
//! writer: a relaxed load and store per observation); a scrape sums the shards. The labels
//! are the closed set [`ReqOp::ALL`], so the family's size never depends on traffic or keys.

use std::time::Duration;

use super::Counter;

/// The `operation` label: what kind of request was answered (the HTTP layer classifies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqOp {
    Put,
    Get,
    Exist,
    Query,
    Remove,
    RemoveAll,
    BatchPut,
    BatchGet,
    BatchExist,
    BatchQuery,
    BatchRemove,
    Metadata,
    GetAllKeys,
    Segments,
    Memory,
    Scrape,
    Health,
    Other,
}

impl ReqOp {
    pub const ALL: [ReqOp; 18] = [
        ReqOp::Put,
        ReqOp::Get,
        ReqOp::Exist,
        ReqOp::Query,
        ReqOp::Remove,
        ReqOp::RemoveAll,
        ReqOp::BatchPut,
        ReqOp::BatchGet,
        ReqOp::BatchExist,
        ReqOp::BatchQuery,
        ReqOp::BatchRemove,
        ReqOp::Metadata,
        ReqOp::GetAllKeys,
        ReqOp::Segments,
        ReqOp::Memory,
        ReqOp::Scrape,
        ReqOp::Health,
        ReqOp::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReqOp::Put => "put",
            ReqOp::Get => "get",
            ReqOp::Exist => "exist",
            ReqOp::Query => "query",
            ReqOp::Remove => "remove",
            ReqOp::RemoveAll => "remove_all",
            ReqOp::BatchPut => "batch_put",
            ReqOp::BatchGet => "batch_get",
            ReqOp::BatchExist => "batch_exist",
            ReqOp::BatchQuery => "batch_query",
            ReqOp::BatchRemove => "batch_remove",
            ReqOp::Metadata => "metadata",
            ReqOp::GetAllKeys => "get_all_keys",
            ReqOp::Segments => "segments",
            ReqOp::Memory => "memory",
            ReqOp::Scrape => "scrape",
            ReqOp::Health => "health",
            ReqOp::Other => "other",
        }
    }
}

/// Bucket upper bounds, 10 µs to 10 s (`+Inf` follows): in nanoseconds, and in seconds as the
/// exposition writes them (`le` values).
pub const BOUNDS: [(u64, &str); 19] = [
    (10_000, "1e-05"),
    (25_000, "2.5e-05"),
    (50_000, "5e-05"),
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
    (5_000_000_000, "5"),
    (10_000_000_000, "10"),
];

/// Buckets per operation, `+Inf` last.
pub const BUCKETS: usize = BOUNDS.len() + 1;

#[derive(Default, Debug)]
struct OpBuckets {
    /// Per-bucket (not cumulative) counts.
    counts: [Counter; BUCKETS],
    sum_ns: Counter,
}

/// One shard's request latencies. Written only by the shard, read by any scrape.
#[derive(Default, Debug)]
pub struct RequestDurations {
    ops: [OpBuckets; ReqOp::ALL.len()],
}

/// One operation summed over shards.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merged {
    /// Per-bucket (not cumulative) counts, `+Inf` last.
    pub counts: [u64; BUCKETS],
    pub sum_ns: u64,
}

impl RequestDurations {
    /// Records one request of `op` that took `d`. Only the owning shard calls this.
    #[inline]
    pub fn observe(&self, op: ReqOp, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let o = &self.ops[op as usize];
        let i = BOUNDS
            .iter()
            .position(|&(b, _)| ns <= b)
            .unwrap_or(BOUNDS.len());
        o.counts[i].inc();
        o.sum_ns.add(ns);
    }

    /// Adds this shard's figures for `op` into `acc`.
    pub fn add_to(&self, op: ReqOp, acc: &mut Merged) {
        let o = &self.ops[op as usize];
        for (a, c) in acc.counts.iter_mut().zip(&o.counts) {
            *a += c.get();
        }
        acc.sum_ns += o.sum_ns.get();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let r = RequestDurations::default();
        r.observe(ReqOp::Get, Duration::from_nanos(10_000)); // exactly 10 µs: first bucket
        r.observe(ReqOp::Get, Duration::from_nanos(10_001));
        r.observe(ReqOp::Get, Duration::from_millis(3));
        r.observe(ReqOp::Get, Duration::from_secs(60));
        r.observe(ReqOp::Put, Duration::from_secs(1));
        let mut m = Merged::default();
        r.add_to(ReqOp::Get, &mut m);
        r.add_to(ReqOp::Get, &mut m); // a second shard with the same figures
        assert_eq!(m.counts[0], 2);
        assert_eq!(m.counts[1], 2);
        assert_eq!(m.counts[8], 2, "3 ms is under 5 ms");
        assert_eq!(m.counts[BUCKETS - 1], 2, "60 s is only under +Inf");
        assert_eq!(m.counts.iter().sum::<u64>(), 8);
        assert_eq!(m.sum_ns, 2 * (20_001 + 3_000_000 + 60_000_000_000));
        let mut put = Merged::default();
        r.add_to(ReqOp::Put, &mut put);
        assert_eq!(put.counts[15], 1, "1 s is in the le=\"1\" bucket");
    }

    #[test]
    fn bounds_are_increasing_and_printed_as_written() {
        assert!(BOUNDS.windows(2).all(|w| w[0].0 < w[1].0));
        for (ns, text) in BOUNDS {
            assert_eq!(text.parse::<f64>().unwrap(), ns as f64 / 1e9);
        }
    }
}
