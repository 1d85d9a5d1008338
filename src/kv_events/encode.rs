//! vLLM's KV-event wire encoding: a msgpack `EventBatch` `[ts, events, data_parallel_rank]`,
//! each event a map tagged by `"type"` (the form current vLLM sends and routers decode by
//! field name).

use rmp::encode;

use super::KvEvent;
use crate::shards::store::segment::Medium;

/// The medium strings routers accept.
pub fn medium_name(m: Medium) -> &'static str {
    match m {
        Medium::Hbm => "GPU",
        Medium::Dram => "CPU",
        Medium::Ssd => "DISK",
    }
}

/// Encodes one batch. `block_size` is reported in `BlockStored` (token ids are not known to
/// this server: the list is empty).
pub fn batch(
    out: &mut Vec<u8>,
    ts: f64,
    events: &[KvEvent],
    data_parallel_rank: i64,
    block_size: u64,
) {
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = encode::write_array_len(out, 3);
    let _ = encode::write_f64(out, ts);
    let _ = encode::write_array_len(out, events.len() as u32);
    for e in events {
        event(out, e, block_size);
    }
    let _ = encode::write_sint(out, data_parallel_rank);
}

fn str(out: &mut Vec<u8>, s: &str) {
    let _ = encode::write_str(out, s);
}

fn event(out: &mut Vec<u8>, e: &KvEvent, block_size: u64) {
    match *e {
        KvEvent::Stored { hash, medium } => {
            let _ = encode::write_map_len(out, 8);
            str(out, "type");
            str(out, "BlockStored");
            str(out, "block_hashes");
            let _ = encode::write_array_len(out, 1);
            let _ = encode::write_uint(out, hash);
            str(out, "parent_block_hash");
            let _ = encode::write_nil(out);
            str(out, "token_ids");
            let _ = encode::write_array_len(out, 0);
            str(out, "block_size");
            let _ = encode::write_uint(out, block_size);
            str(out, "lora_id");
            let _ = encode::write_nil(out);
            str(out, "medium");
            str(out, medium_name(medium));
            str(out, "lora_name");
            let _ = encode::write_nil(out);
        }
        KvEvent::Removed { hash, medium } => {
            let _ = encode::write_map_len(out, 3);
            str(out, "type");
            str(out, "BlockRemoved");
            str(out, "block_hashes");
            let _ = encode::write_array_len(out, 1);
            let _ = encode::write_uint(out, hash);
            str(out, "medium");
            str(out, medium_name(medium));
        }
        KvEvent::Cleared => {
            let _ = encode::write_map_len(out, 1);
            str(out, "type");
            str(out, "AllBlocksCleared");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_decode_as_vllm_shapes() {
        let mut out = Vec::new();
        let events = [
            KvEvent::Stored {
                hash: u64::MAX,
                medium: Medium::Dram,
            },
            KvEvent::Removed {
                hash: 7,
                medium: Medium::Ssd,
            },
            KvEvent::Cleared,
        ];
        batch(&mut out, 1.5, &events, 3, 256);
        // Decode with serde_json-free manual checks: array of 3, float, array of 3 maps, int.
        let mut rd = &out[..];
        assert_eq!(rmp::decode::read_array_len(&mut rd).unwrap(), 3);
        assert_eq!(rmp::decode::read_f64(&mut rd).unwrap(), 1.5);
        assert_eq!(rmp::decode::read_array_len(&mut rd).unwrap(), 3);
        assert_eq!(rmp::decode::read_map_len(&mut rd).unwrap(), 8);
        let mut buf = [0u8; 32];
        assert_eq!(rmp::decode::read_str(&mut rd, &mut buf).unwrap(), "type");
        assert_eq!(
            rmp::decode::read_str(&mut rd, &mut buf).unwrap(),
            "BlockStored"
        );
        assert_eq!(
            rmp::decode::read_str(&mut rd, &mut buf).unwrap(),
            "block_hashes"
        );
        assert_eq!(rmp::decode::read_array_len(&mut rd).unwrap(), 1);
        assert_eq!(rmp::decode::read_int::<u64, _>(&mut rd).unwrap(), u64::MAX);
        // The batch ends with the data-parallel rank.
        assert_eq!(out.last(), Some(&3));
    }
}
