//! `/metrics/summary`: one line of `key=value`, the seed's 71 fields in order, then the
//! per-rank fields, written straight into the answer's buffer.

use super::families::{TIER_FAMILIES, tier_rank, tier_total};
use super::{medium_usage, per_rank_ranks, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::store::{Op, OpCounters, TierCounters};
use crate::metrics::view::Source;

/// Writes `key=value` fields separated by spaces.
struct Fields<'a> {
    buf: &'a mut Vec<u8>,
    first: bool,
    digits: itoa::Buffer,
}

impl Fields<'_> {
    fn key(&mut self, k: &[&str]) {
        if !self.first {
            self.buf.push(b' ');
        }
        self.first = false;
        for part in k {
            self.buf.extend_from_slice(part.as_bytes());
        }
        self.buf.push(b'=');
    }

    fn int(&mut self, k: &[&str], v: u64) {
        self.key(k);
        self.buf.extend_from_slice(self.digits.format(v).as_bytes());
    }
}

/// Renders `/metrics/summary`: the seed's 71 fields in order, then the per-rank fields.
pub fn render_summary(shared: &dyn Source, buf: &mut Vec<u8>) {
    let mut out = Fields {
        buf,
        first: true,
        digits: itoa::Buffer::new(),
    };
    out.int(
        &["keys"],
        sum_i(shared, |s| s.store_stats.stored_keys.get()),
    );
    for (field, name) in TIER_FIELDS {
        out.int(&[field], tier_total(shared, tier(name)));
    }
    for (field, m) in [
        ("hbm_used", Medium::Hbm),
        ("dram_used", Medium::Dram),
        ("ssd_used", Medium::Ssd),
    ] {
        let (c, u) = medium_usage(shared, m);
        out.int(&[field], u);
        out.buf.push(b'/');
        out.buf
            .extend_from_slice(itoa::Buffer::new().format(c).as_bytes());
    }
    op_fields(shared, &mut out);
    let per_rank = per_rank_ranks(shared);
    let mut rank = itoa::Buffer::new();
    for base in PER_RANK_FIELDS {
        for &r in &per_rank {
            out.int(
                &[base, "_by_rank_", rank.format(r)],
                tier_rank(shared, r, tier(base)),
            );
        }
    }
}

/// The tier fields after `keys`: (summary field, tier family's summary name).
const TIER_FIELDS: [(&str, &str); 9] = [
    ("evict", "evict"),
    ("rewarm", "rewarm"),
    ("rewarm_fail", "rewarm_fail"),
    ("rewarm_bytes_total", "rewarm_bytes"),
    ("rewarm_bytes_current", "rewarm_bytes_current"),
    ("flush_blobs", "flush_blobs"),
    ("flush_bytes", "flush_bytes"),
    ("get_hit_dram", "get_hit_dram"),
    ("get_hit_ssd", "get_hit_ssd"),
];

/// The per-rank fields' bases, in output order.
const PER_RANK_FIELDS: [&str; 9] = [
    "evict",
    "get_hit_dram",
    "get_hit_ssd",
    "rewarm",
    "rewarm_fail",
    "rewarm_bytes",
    "rewarm_bytes_current",
    "flush_blobs",
    "flush_bytes",
];

/// The tier counter behind a summary name.
fn tier(name: &str) -> fn(&TierCounters) -> i64 {
    TIER_FAMILIES
        .iter()
        .find(|t| t.1 == name)
        .map(|t| t.2)
        .expect("known tier field")
}

/// `<op>_req`, `_success`, `_fail` (and `_not_found`) of every business operation.
fn op_fields(shared: &dyn Source, out: &mut Fields<'_>) {
    for op in Op::ALL {
        let i = op as usize;
        let n = op.name();
        let ops = |f: fn(&OpCounters) -> u64| sum(shared, |s| f(&s.store_stats.ops[i]));
        out.int(&[n, "_req"], ops(|c| c.requests.get()));
        out.int(&[n, "_success"], ops(|c| c.successes.get()));
        out.int(&[n, "_fail"], ops(|c| c.failures.get()));
        if op.has_not_found() {
            out.int(&[n, "_not_found"], ops(|c| c.not_found.get()));
        }
    }
}
