//! Segment vocabulary: a segment's id and the bounds of its size, which the configuration,
//! the HTTP handlers and the store all check.

use super::medium::Medium;

/// Allocation granule: blobs start on page boundaries (what DMA engines and `madvise` need).
pub const PAGE_BYTES: u64 = 4096;

/// The largest segment: gvas give each segment a 1 TiB window.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;

/// A segment's id: `rank-<r>-<medium-lower>`.
pub fn segment_name(rank: u32, medium: Medium) -> String {
    format!("rank-{rank}-{}", medium.lower())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(segment_name(3, Medium::Hbm), "rank-3-hbm");
        assert_eq!(segment_name(0, Medium::Ssd), "rank-0-ssd");
    }
}
