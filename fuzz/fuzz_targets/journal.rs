//! The SSD journal's replay (`mmc::shards::store::ssd::journal::replay`): a journal is read
//! back at every start, and a damaged one is input. Byte 0 `H` puts a valid header (capacity
//! 1 TiB) before the rest, so that most inputs reach the records.
//!
//! Properties: no panic; the tail is within the input and the records fit before it; the live
//! entries' ranges do not overlap; a snapshot of them replays to the same entries, whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmc::shards::store::ssd::journal::{HEADER_BYTES, header, replay, snapshot};

fuzz_target!(|data: &[u8]| {
    let bytes = match data.split_first() {
        Some((b'H', rest)) => [&header(1 << 40)[..], rest].concat(),
        _ => data.to_vec(),
    };
    let r = replay(&bytes);
    assert!(r.tail_bytes as usize <= bytes.len());
    if r.capacity.is_some() {
        assert!(HEADER_BYTES + 12 * r.records as usize + r.tail_bytes as usize <= bytes.len());
    } else {
        assert!(r.entries.is_empty() && r.records == 0);
    }
    let mut end = 0u64;
    for (&offset, l) in &r.entries {
        assert_eq!(offset, l.entry.offset);
        assert!(offset >= end, "overlapping entries at {offset}");
        end = offset.saturating_add(l.entry.len.max(1));
    }
    let again = replay(&snapshot(1 << 40, r.entries.values()));
    assert_eq!(again.tail_bytes, 0);
    assert_eq!(again.entries, r.entries);
});
