//! `/metrics/summary`: one line of `key=value`, the seed's 71 fields in order, then the
//! per-rank fields.

use std::io::Write;

use super::families::{TIER_FAMILIES, tier_rank, tier_total};
use super::{medium_usage, per_rank_ranks, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::store::Op;
use crate::shards::Cluster;

/// Renders `/metrics/summary`: the seed's 71 fields in order, then the per-rank fields.
pub fn render_summary(cluster: &Cluster, buf: &mut Vec<u8>) {
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
fn op_fields(cluster: &Cluster, put: &mut impl FnMut(&str, String)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_the_seed_fields_in_order() {
        let cluster = Cluster::new(
            crate::config::Config::defaults(),
            2,
            crate::shards::FrontAssets::default(),
        )
        .unwrap();
        let mut buf = Vec::new();
        render_summary(&cluster, &mut buf);
        let line = String::from_utf8(buf).unwrap();
        assert!(!line.contains('\n'));
        let keys: Vec<&str> = line
            .split(' ')
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        let expected = "keys evict rewarm rewarm_fail rewarm_bytes_total rewarm_bytes_current flush_blobs flush_bytes get_hit_dram get_hit_ssd hbm_used dram_used ssd_used alloc_req alloc_success alloc_fail batch_alloc_req batch_alloc_success batch_alloc_fail get_req get_success get_fail get_not_found batch_get_req batch_get_success batch_get_fail batch_get_not_found remove_req remove_success remove_fail remove_not_found batch_remove_req batch_remove_success batch_remove_fail batch_remove_not_found remove_all_req remove_all_success remove_all_fail update_state_req update_state_success update_state_fail update_state_not_found batch_update_state_req batch_update_state_success batch_update_state_fail batch_update_state_not_found query_req query_success query_fail query_not_found batch_query_req batch_query_success batch_query_fail batch_query_not_found get_all_keys_req get_all_keys_success get_all_keys_fail exist_key_req exist_key_success exist_key_fail exist_key_not_found batch_exist_key_req batch_exist_key_success batch_exist_key_fail batch_exist_key_not_found mount_req mount_success mount_fail unmount_req unmount_success unmount_fail";
        assert_eq!(keys.join(" "), expected);
        assert_eq!(keys.len(), 71);
        assert!(
            line.contains(" hbm_used=0/1073741824 dram_used=0/1073741824 ssd_used=0/0 "),
            "{line}"
        );
    }
}
