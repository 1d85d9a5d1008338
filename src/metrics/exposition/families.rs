//! The contract's `memcache_*` families: capacity, business calls, tiers, KV events.

use std::sync::OnceLock;

use super::writer::{Family, Kind, Out, family};
use super::{medium_usage, sum, sum_i};
use crate::common::medium::Medium;
use crate::metrics::kv_events::{EventType, KvEventStats, MEDIUM_LABELS};
use crate::metrics::store::{Op, OpCounters, TierCounters};
use crate::metrics::view::{SegmentFigures, Source};

/// The `CamelCase` name of an operation in HELP texts (`BatchGet`).
fn camel(op: Op) -> String {
    op.name()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

type TierField = fn(&TierCounters) -> i64;
type OpField = fn(&OpCounters) -> u64;

/// The tier families of the eviction / flush / rewarm / hit group, in output order:
/// (family, summary field, value).
pub(super) static TIER_FAMILIES: &[(Family, &str, TierField)] = &[
    (
        family!(
            "memcache_evict_operations_total",
            "Total number of eviction operations",
            counter
        ),
        "evict",
        |t| t.evict.get() as i64,
    ),
    (
        family!(
            "memcache_flush_blobs_total",
            "Total number of blobs flushed to SSD asynchronously",
            counter
        ),
        "flush_blobs",
        |t| t.flush_blobs.get() as i64,
    ),
    (
        family!(
            "memcache_flush_bytes_total",
            "Total bytes flushed to SSD asynchronously",
            counter
        ),
        "flush_bytes",
        |t| t.flush_bytes.get() as i64,
    ),
    (
        family!(
            "memcache_get_hits_dram_total",
            "Total number of Get hits served from DRAM",
            counter
        ),
        "get_hit_dram",
        |t| t.get_hits_dram.get() as i64,
    ),
    (
        family!(
            "memcache_get_hits_ssd_total",
            "Total number of Get hits served from SSD (rewarm)",
            counter
        ),
        "get_hit_ssd",
        |t| t.get_hits_ssd.get() as i64,
    ),
    (
        family!(
            "memcache_rewarm_total",
            "Total number of SSD->DRAM rewarm operations",
            counter
        ),
        "rewarm",
        |t| t.rewarm.get() as i64,
    ),
    (
        family!(
            "memcache_rewarm_failed_total",
            "Total number of failed SSD->DRAM rewarm operations",
            counter
        ),
        "rewarm_fail",
        |t| t.rewarm_failed.get() as i64,
    ),
    (
        family!(
            "memcache_rewarm_bytes_total",
            "Total bytes rewarmed from SSD to DRAM",
            counter
        ),
        "rewarm_bytes",
        |t| t.rewarm_bytes.get() as i64,
    ),
    (
        family!(
            "memcache_rewarm_bytes_current",
            "Current bytes occupied by rewarmed data",
            gauge
        ),
        "rewarm_bytes_current",
        |t| t.rewarm_bytes_current.get(),
    ),
];

pub(super) fn tier_total(shared: &dyn Source, f: TierField) -> u64 {
    sum_i(shared, |s| f(&s.store_stats.tier))
}

pub(super) fn tier_rank(shared: &dyn Source, rank: u32, f: TierField) -> u64 {
    sum_i(shared, |s| f(&s.store_stats.tier_by_rank[rank as usize]))
}

/// Whether eviction work is in progress anywhere: a pass running, or flushes it started.
fn evict_running(shared: &dyn Source) -> u64 {
    let running = shared.shards().any(|s| {
        s.store_stats.evict_running.get() > 0 || s.store_stats.flush_in_flight_bytes.get() > 0
    });
    running as u64
}

type SegmentField = fn(&dyn SegmentFigures) -> u64;

/// A (capacity, used) pair to one of its figures.
type MediumField = fn((u64, u64)) -> u64;

static PER_SEGMENT: [(Family, SegmentField); 2] = [
    (
        family!(
            "memcache_segment_capacity_bytes",
            "Segment total capacity in bytes",
            gauge
        ),
        |s| s.capacity(),
    ),
    (
        family!(
            "memcache_segment_allocated_bytes",
            "Segment allocated bytes",
            gauge
        ),
        |s| s.used_bytes(),
    ),
];

static PER_MEDIUM: [(Family, MediumField); 2] = [
    (
        family!(
            "memcache_total_capacity_bytes",
            "Total capacity by medium in bytes",
            gauge
        ),
        |cu| cu.0,
    ),
    (
        family!(
            "memcache_allocated_bytes",
            "Allocated bytes by medium",
            gauge
        ),
        |cu| cu.1,
    ),
];

/// Segment and medium capacity and use.
pub(super) fn render_capacity(shared: &dyn Source, o: &mut Out<'_>) {
    let segs = shared.segments();
    // SSD is shown only when it has capacity or use.
    let mut usage = [(Medium::Ssd, (0, 0)); Medium::ALL.len()];
    let mut shown = 0;
    for &m in &Medium::ALL {
        let (c, u) = medium_usage(shared, m);
        if m != Medium::Ssd || c > 0 || u > 0 {
            usage[shown] = (m, (c, u));
            shown += 1;
        }
    }
    let usage = &usage[..shown];
    let gather = |figures: &mut Vec<u64>| {
        for s in segs.iter() {
            push_text(figures, s.name());
            figures.extend(PER_SEGMENT.iter().map(|(_, f)| f(s)));
        }
        for &(m, (c, u)) in usage {
            figures.extend([m as u64, c, u]);
        }
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        // The segments' figures, in the order gathered: (name, capacity, used) each.
        let mut at = 0;
        let mut per_segment = Vec::new();
        for s in segs.iter() {
            at += text_figures(s.name());
            per_segment.push((s.name(), &figures[at..at + PER_SEGMENT.len()]));
            at += PER_SEGMENT.len();
        }
        for (i, (fam, _)) in PER_SEGMENT.iter().enumerate() {
            o.family(fam);
            for (name, v) in &per_segment {
                o.int(&[("segment", name)], v[i]);
            }
        }
        for (i, (fam, _)) in PER_MEDIUM.iter().enumerate() {
            o.family(fam);
            for (&(m, _), v) in usage.iter().zip(figures[at..].chunks(3)) {
                o.int(&[("medium", m.lower())], v[1 + i]);
            }
        }
    };
    block(o, &PER_SEGMENT[0].0, gather, write);
}

/// Adds a text that decides a block's labels to its figures, exactly: its length, then its
/// bytes 8 to a figure ([`text_figures`] of them).
pub(super) fn push_text(figures: &mut Vec<u64>, s: &str) {
    figures.push(s.len() as u64);
    figures.extend(s.as_bytes().chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    }));
}

/// How many figures [`push_text`] adds for `s`.
pub(super) fn text_figures(s: &str) -> usize {
    1 + s.len().div_ceil(8)
}

/// The business-call families in output order: requests, successes, failures (and
/// not-found results) of each operation, as (operation index, family, counter). Their names
/// and HELP texts are made from the operations' names once.
fn business_families() -> &'static [(usize, Family, OpField)] {
    static FAMILIES: OnceLock<Vec<(usize, Family, OpField)>> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        let mut out = Vec::new();
        for op in Op::ALL {
            let name = camel(op);
            let mut parts: Vec<(&str, &str, OpField)> = vec![
                ("requests", "requests", |c| c.requests.get()),
                ("successes", "successes", |c| c.successes.get()),
                ("failures", "failures", |c| c.failures.get()),
            ];
            if op.has_not_found() {
                parts.push(("not_found", "not found results", |c| c.not_found.get()));
            }
            for (suffix, what, f) in parts {
                let family = Family::leaked(
                    format!("memcache_{}_{suffix}_total", op.name()),
                    format!("Total number of {name} {what}"),
                    Kind::Counter,
                );
                out.push((op as usize, family, f));
            }
        }
        out
    })
}

thread_local! {
    /// A block's figures, gathered before it is written (reused).
    static FIGURES: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Gathers a block's figures with `gather`, then writes the block from them (`Out::block`).
pub(super) fn block(
    o: &mut Out<'_>,
    first: &'static Family,
    gather: impl FnOnce(&mut Vec<u64>),
    write: impl FnOnce(&mut Out<'_>, &[u64]),
) {
    FIGURES.with_borrow_mut(|figures| {
        figures.clear();
        gather(figures);
        o.block(first, figures, |o| write(o, figures));
    });
}

/// The business-call counters: requests, successes, failures (and not-found results) per
/// operation, in total and per rank.
pub(super) fn render_business(shared: &dyn Source, o: &mut Out<'_>, per_rank: &[u32]) {
    let families = business_families();
    let gather = |figures: &mut Vec<u64>| {
        figures.extend(per_rank.iter().map(|&r| u64::from(r)));
        for (i, _, f) in families {
            figures.push(sum(shared, |s| f(&s.store_stats.ops[*i])));
            for &r in per_rank {
                figures.push(sum(shared, |s| {
                    f(&s.store_stats.ops_by_rank[r as usize][*i])
                }));
            }
        }
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let mut digits = itoa::Buffer::new();
        let mut v = figures[per_rank.len()..].iter();
        for (_, family, _) in families {
            o.family(family);
            o.int(&[], *v.next().expect("a figure"));
            for &r in per_rank {
                o.int(&[("rank", digits.format(r))], *v.next().expect("a figure"));
            }
        }
    };
    block(o, &families[0].1, gather, write);
}

static EVICT_RUNNING: Family = family!(
    "memcache_evict_running",
    "Whether eviction (GC) is currently running (1=yes, 0=no)",
    gauge
);

static STORED_KEYS: Family = family!(
    "memcache_stored_keys",
    "Current number of stored keys",
    gauge
);

/// Eviction, flush, rewarm and hit counters, in total and per rank; stored keys.
pub(super) fn render_tiers(shared: &dyn Source, o: &mut Out<'_>, per_rank: &[u32]) {
    let gather = |figures: &mut Vec<u64>| {
        figures.extend(per_rank.iter().map(|&r| u64::from(r)));
        for (_, _, f) in TIER_FAMILIES {
            figures.push(tier_total(shared, *f));
            figures.extend(per_rank.iter().map(|&r| tier_rank(shared, r, *f)));
        }
        figures.push(evict_running(shared));
        figures.push(sum_i(shared, |s| s.store_stats.stored_keys.get()));
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let mut digits = itoa::Buffer::new();
        let mut v = figures[per_rank.len()..].iter().copied();
        let mut next = || v.next().expect("a figure");
        let running = figures[figures.len() - 2];
        for (idx, (family, _, _)) in TIER_FAMILIES.iter().enumerate() {
            o.family(family);
            o.int(&[], next());
            for &r in per_rank {
                o.int(&[("rank", digits.format(r))], next());
            }
            if idx == 0 {
                o.single(&EVICT_RUNNING, running);
            }
        }
        next();
        o.single(&STORED_KEYS, next());
    };
    block(o, &TIER_FAMILIES[0].0, gather, write);
}

type ClusterField = fn(&dyn Source) -> u64;

/// One-sample families: (family, value).
pub(super) type Single = (Family, ClusterField);

fn kv(c: &dyn Source) -> &KvEventStats {
    c.kv_stats()
}

static KV_PUBLISHED: Family = family!(
    "memcache_kv_events_published_total",
    "Total KV cache events published",
    counter
);

static KV_BY_TYPE: Family = family!(
    "memcache_kv_events_published_by_type_total",
    "Total KV cache events published by event type",
    counter
);

static KV_BY_MEDIUM: Family = family!(
    "memcache_kv_events_published_by_medium_total",
    "Total KV cache events published by storage medium",
    counter
);

/// The KV-event families after the by-type and by-medium ones, in output order.
static KV_SINGLES: &[Single] = &[
    (
        family!(
            "memcache_kv_events_dropped_total",
            "Total KV cache events dropped on queue pressure",
            counter
        ),
        |c| kv(c).dropped_events(),
    ),
    (
        family!(
            "memcache_kv_events_dropped_stored_total",
            "Total KV cache stored events dropped on full queue",
            counter
        ),
        |c| kv(c).dropped_stored(),
    ),
    (
        family!(
            "memcache_kv_events_dropped_high_priority_total",
            "Total KV cache removed or cleared events dropped after hard queue limit",
            counter
        ),
        |c| kv(c).dropped_high_priority(),
    ),
    (
        family!(
            "memcache_kv_events_skipped_unparsed_total",
            "Total KV cache events that could not derive block_hashes from object key",
            counter
        ),
        |c| kv(c).skipped_unparsed_keys(),
    ),
    (
        family!(
            "memcache_kv_events_queue_size",
            "Current KV cache event queue size",
            gauge
        ),
        |c| KvEventStats::get(&kv(c).queue_size),
    ),
    (
        family!(
            "memcache_kv_events_queue_capacity",
            "Configured KV cache event soft queue capacity",
            gauge
        ),
        |c| c.config().kv_events.queue_capacity,
    ),
    (
        family!(
            "memcache_kv_events_publisher_active",
            "Whether KV event publishing is active",
            gauge
        ),
        |c| {
            kv(c)
                .publisher_active
                .load(std::sync::atomic::Ordering::Relaxed) as u64
        },
    ),
    (
        family!(
            "memcache_kv_events_last_sequence",
            "Last published KV event ZMQ sequence",
            gauge
        ),
        |c| KvEventStats::get(&kv(c).last_sequence),
    ),
];

/// The KV-event publisher's families.
pub(super) fn render_kv_events(shared: &dyn Source, o: &mut Out<'_>) {
    let kv = shared.kv_stats();
    let gather = |figures: &mut Vec<u64>| {
        figures.push(kv.published_events.get());
        figures.extend(EventType::ALL.map(|t| kv.published_by_type[t as usize].get()));
        figures.extend((0..MEDIUM_LABELS.len()).map(|i| kv.published_by_medium[i].get()));
        figures.extend(KV_SINGLES.iter().map(|(_, f)| f(shared)));
    };
    let write = |o: &mut Out<'_>, figures: &[u64]| {
        let mut v = figures.iter().copied();
        let mut next = || v.next().expect("a figure");
        o.single(&KV_PUBLISHED, next());
        o.family(&KV_BY_TYPE);
        for t in EventType::ALL {
            o.int(&[("type", t.name())], next());
        }
        o.family(&KV_BY_MEDIUM);
        for m in MEDIUM_LABELS {
            o.int(&[("medium", m)], next());
        }
        for (family, _) in KV_SINGLES {
            o.single(family, next());
        }
    };
    block(o, &KV_PUBLISHED, gather, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_names() {
        assert_eq!(camel(Op::BatchUpdateState), "BatchUpdateState");
        assert_eq!(camel(Op::Get), "Get");
        assert_eq!(camel(Op::GetAllKeys), "GetAllKeys");
    }
}
