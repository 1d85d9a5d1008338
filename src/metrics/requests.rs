//! Request latency per operation: the `memcache_http_request_duration_seconds` histogram
//! family. Each shard records the requests it answers into its own fixed buckets (single
//! writer: a relaxed load and store per observation); a scrape sums the shards. The labels
//! are the closed set [`ReqOp::ALL`], so the family's size never depends on traffic or keys.
//!
//! Beside the 20 classic buckets, each observation is also counted in the buckets of a
//! native histogram (exponential, [`NATIVE_SCHEMA`]), which the protobuf exposition sends to
//! a Prometheus that takes native histograms: the same requests at a finer resolution, in a
//! few sparse spans.

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

/// The native (sparse, exponential) histogram kept beside the classic buckets: schema 3, so
/// bucket `k` holds the durations in `(2^((k-1)/8), 2^(k/8)]` seconds (each bucket 9 % wider
/// than the one below, the resolution Prometheus clients use by default), every observation
/// in its own bucket rather than one of the 20 classic ones.
pub const NATIVE_SCHEMA: i32 = 3;
/// The lowest bucket: `(2^-30, 2^(-239/8)]` s, from just under 1 ns. Durations of 0 (at most
/// [`NATIVE_ZERO_THRESHOLD`]) count in the zero bucket.
pub const NATIVE_MIN_KEY: i32 = -239;
/// The highest bucket: up to `2^12` s (68 minutes); a longer request counts in it.
pub const NATIVE_MAX_KEY: i32 = 96;
/// Native buckets per operation.
pub const NATIVE_BUCKETS: usize = (NATIVE_MAX_KEY - NATIVE_MIN_KEY + 1) as usize;
/// The zero bucket's upper bound, seconds: `2^-30`.
pub const NATIVE_ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;

/// `2^(j/8 - 1)` for `j` in 0..8: where a value's binary fraction (in `[0.5, 1)`) crosses
/// from one bucket into the next within an octave.
const OCTAVE_BOUNDS: [f64; 8] = [
    0.5,
    0.545_253_866_332_628_8,
    0.594_603_557_501_360_5,
    0.648_419_777_325_504_8,
    std::f64::consts::FRAC_1_SQRT_2,
    0.771_105_412_703_970_4,
    0.840_896_415_253_714_5,
    0.917_004_043_204_671_2,
];

/// The schema-3 bucket of `secs` (> 0, finite): the smallest `k` with `secs <= 2^(k/8)`.
fn native_key(secs: f64) -> i32 {
    // secs = frac * 2^exp with frac in [0.5, 1) (durations from 1 ns up are normal floats).
    let bits = secs.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32 - 1022;
    let frac = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1022u64 << 52));
    let j = OCTAVE_BOUNDS.iter().take_while(|&&b| b < frac).count() as i32;
    j + (exp - 1) * 8
}

#[derive(Debug)]
struct OpBuckets {
    /// Per-bucket (not cumulative) counts.
    counts: [Counter; BUCKETS],
    sum_ns: Counter,
    /// The native histogram's buckets, [`NATIVE_MIN_KEY`] first, and its zero bucket.
    native: Box<[Counter]>,
    native_zero: Counter,
}

impl Default for OpBuckets {
    fn default() -> Self {
        OpBuckets {
            counts: Default::default(),
            sum_ns: Counter::default(),
            native: (0..NATIVE_BUCKETS).map(|_| Counter::default()).collect(),
            native_zero: Counter::default(),
        }
    }
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

/// One operation's native histogram summed over shards.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeMerged {
    /// Bucket `NATIVE_MIN_KEY + i`'s count at `i`.
    pub counts: [u64; NATIVE_BUCKETS],
    /// Observations of 0 (at most [`NATIVE_ZERO_THRESHOLD`]).
    pub zero: u64,
}

impl Default for NativeMerged {
    fn default() -> Self {
        NativeMerged {
            counts: [0; NATIVE_BUCKETS],
            zero: 0,
        }
    }
}

impl NativeMerged {
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.zero = 0;
    }
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
        if ns == 0 {
            o.native_zero.inc();
        } else {
            let k = native_key(ns as f64 / 1e9).clamp(NATIVE_MIN_KEY, NATIVE_MAX_KEY);
            o.native[(k - NATIVE_MIN_KEY) as usize].inc();
        }
    }

    /// Adds this shard's figures for `op` into `acc`.
    pub fn add_to(&self, op: ReqOp, acc: &mut Merged) {
        let o = &self.ops[op as usize];
        for (a, c) in acc.counts.iter_mut().zip(&o.counts) {
            *a += c.get();
        }
        acc.sum_ns += o.sum_ns.get();
    }

    /// Adds this shard's native histogram of `op` into `acc`.
    pub fn add_native_to(&self, op: ReqOp, acc: &mut NativeMerged) {
        let o = &self.ops[op as usize];
        for (a, c) in acc.counts.iter_mut().zip(o.native.iter()) {
            *a += c.get();
        }
        acc.zero += o.native_zero.get();
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

    /// Bucket `k` holds `(2^((k-1)/8), 2^(k/8)]`: the powers of two close their bucket, the
    /// values just above them open the next, and each octave has 8 buckets.
    #[test]
    fn native_buckets_follow_schema_3() {
        for (j, b) in OCTAVE_BOUNDS.iter().enumerate() {
            let exact = (j as f64 / 8.0 - 1.0).exp2();
            assert!((b - exact).abs() <= f64::EPSILON, "{j}: {b} vs {exact}");
        }
        assert_eq!(native_key(1.0), 0);
        assert_eq!(native_key(1.0 + 1e-12), 1);
        assert_eq!(native_key(2.0), 8);
        assert_eq!(native_key(0.5), -8);
        assert_eq!(
            native_key(0.75),
            -3,
            "2^(-4/8) = 0.707 < 0.75 <= 2^(-3/8) = 0.771"
        );
        assert_eq!(native_key(1e-9), NATIVE_MIN_KEY, "1 ns");
        assert_eq!(native_key(4096.0), NATIVE_MAX_KEY);
        for k in -200..90 {
            let upper = (k as f64 / 8.0).exp2();
            assert_eq!(native_key(upper * (1.0 - 1e-9)), k, "{k}");
            assert_eq!(native_key(upper * (1.0 + 1e-9)), k + 1, "{k}");
        }
        let r = RequestDurations::default();
        r.observe(ReqOp::Get, Duration::ZERO);
        r.observe(ReqOp::Get, Duration::from_micros(100));
        r.observe(ReqOp::Get, Duration::from_micros(101));
        r.observe(ReqOp::Get, Duration::from_secs(10_000));
        let mut n = NativeMerged::default();
        r.add_native_to(ReqOp::Get, &mut n);
        assert_eq!(n.zero, 1);
        // 100 µs = 2^-13.29: key ceil(8 * -13.29) = -106, 101 µs too.
        assert_eq!(n.counts[(-106 - NATIVE_MIN_KEY) as usize], 2);
        assert_eq!(
            n.counts[NATIVE_BUCKETS - 1],
            1,
            "past 2^12 s: the last bucket"
        );
        assert_eq!(n.counts.iter().sum::<u64>(), 3);
    }

    #[test]
    fn bounds_are_increasing_and_printed_as_written() {
        assert!(BOUNDS.windows(2).all(|w| w[0].0 < w[1].0));
        for (ns, text) in BOUNDS {
            assert_eq!(text.parse::<f64>().unwrap(), ns as f64 / 1e9);
        }
    }
}
