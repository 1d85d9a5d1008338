//! The NUMA placement families (`ock.mmc.numa.enable`): each placed DRAM segment's bytes and
//! allocated bytes per node part. Exported only while some segment is placed on nodes.

use super::writer::Out;
use crate::metrics::view::SegmentFigures;
use crate::metrics::view::Source;

type PartField = fn(&dyn SegmentFigures, usize) -> u64;

pub(super) fn render_numa(cluster: &dyn Source, o: &mut Out<'_>) {
    let segs = cluster.segments();
    if segs.iter().all(|s| s.node_parts().is_empty()) {
        return;
    }
    let families: [(&str, &str, PartField); 2] = [
        (
            "memcache_segment_node_capacity_bytes",
            "Bytes of the segment placed on the NUMA node (its part bound to the node)",
            |s, i| s.node_parts()[i].len,
        ),
        (
            "memcache_segment_node_allocated_bytes",
            "Bytes allocated to blobs in the segment's part on the NUMA node",
            |s, i| s.used_in_part(i),
        ),
    ];
    for (name, help, f) in families {
        o.family(name, help, "gauge");
        for s in segs.iter() {
            for (i, p) in s.node_parts().iter().enumerate() {
                let node = itoa::Buffer::new().format(p.node).to_string();
                o.int(name, &[("segment", s.name()), ("node", &node)], f(s, i));
            }
        }
    }
}
