//! `/metrics/summary`: one line of `key=value`, the seed's 71 fields in order, then the
//! per-rank fields.

use std::io::Write;

use super::families::{TIER_FAMILIES, tier_rank, tier_total};
use super::{medium_usage, per_rank_ranks, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::store::Op;
use crate::metrics::view::Source;

/// Renders `/metrics/summary`: the seed's 71 fields in order, then the per-rank fields.
pub fn render_summary(cluster: &dyn Source, buf: &mut Vec<u8>) {
    let mut fields: Vec<(String, String)> = Vec::with_capacity(96);
    let mut put = |k: &str, v: String| fields.push((k.to_string(), v));
    put(
        "keys",
        sum_i(cluster, |s| s.store_stats.stored_keys.get()).to_string(),
    );
    for (field, name) in TIER_FIELDS {
        put(field, tier_total(cluster, tier(name)).to_string());
    }
    for (field, m) in [
        ("hbm_used", Medium::Hbm),
        ("dram_used", Medium::Dram),
        ("ssd_used", Medium::Ssd),
    ] {
        let (c, u) = medium_usage(cluster, m);
        put(field, format!("{u}/{c}"));
    }
    op_fields(cluster, &mut put);
    let per_rank = per_rank_ranks(cluster);
    for base in PER_RANK_FIELDS {
        for &r in &per_rank {
            put(
                &format!("{base}_by_rank_{r}"),
                tier_rank(cluster, r, tier(base)).to_string(),
            );
        }
    }
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            buf.push(b' ');
        }
        let _ = write!(buf, "{k}={v}");
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
fn tier(name: &str) -> fn(&crate::metrics::store::TierCounters) -> i64 {
    TIER_FAMILIES
        .iter()
        .find(|t| t.1 == name)
        .map(|t| t.4)
        .expect("known tier field")
}

/// `<op>_req`, `_success`, `_fail` (and `_not_found`) of every business operation.
fn op_fields(cluster: &dyn Source, put: &mut impl FnMut(&str, String)) {
    for op in Op::ALL {
        let i = op as usize;
        let n = op.name();
        let ops = |f: fn(&crate::metrics::store::OpCounters) -> u64| {
            sum(cluster, |s| f(&s.store_stats.ops[i])).to_string()
        };
        put(&format!("{n}_req"), ops(|c| c.requests.get()));
        put(&format!("{n}_success"), ops(|c| c.successes.get()));
        put(&format!("{n}_fail"), ops(|c| c.failures.get()));
        if op.has_not_found() {
            put(&format!("{n}_not_found"), ops(|c| c.not_found.get()));
        }
    }
}
