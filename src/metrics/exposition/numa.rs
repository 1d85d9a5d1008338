//! The NUMA placement families (`ock.mmc.numa.enable`): each placed DRAM segment's bytes and
//! allocated bytes per node part. Exported only while some segment is placed on nodes.

use super::writer::{Family, Out, family};
use crate::metrics::view::SegmentFigures;
use crate::metrics::view::Source;

type PartField = fn(&dyn SegmentFigures, usize) -> u64;

static FAMILIES: [(Family, PartField); 2] = [
    (
        family!(
            "memcache_segment_node_capacity_bytes",
            "Bytes of the segment placed on the NUMA node (its part bound to the node)",
            gauge
        ),
        |s, i| s.node_parts()[i].len,
    ),
    (
        family!(
            "memcache_segment_node_allocated_bytes",
            "Bytes allocated to blobs in the segment's part on the NUMA node",
            gauge
        ),
        |s, i| s.used_in_part(i),
    ),
];

pub(super) fn render_numa(shared: &dyn Source, o: &mut Out<'_>) {
    let segs = shared.segments();
    if segs.iter().all(|s| s.node_parts().is_empty()) {
        return;
    }
    let mut digits = itoa::Buffer::new();
    for (family, f) in &FAMILIES {
        o.family(family);
        for s in segs.iter() {
            for (i, p) in s.node_parts().iter().enumerate() {
                let labels = [("segment", s.name()), ("node", digits.format(p.node))];
                o.int(&labels, f(s, i));
            }
        }
    }
}
