//! vLLM's KV-event wire encoding: one msgpack `EventBatch` per message, in either of vLLM's
//! two wire generations ([`KvEncoding`]). Real consumers decode with typed msgspec / Go
//! decoders, so each accepts exactly one form and rejects a mix of the two.
//!
//! - [`KvEncoding::Array`] (positional, msgspec `array_like`; vLLM up to 0.11, llm-d, Dynamo):
//!   the batch is `[ts, events, data_parallel_rank]`, each event an array whose first element
//!   is its tag, the rest its fields in vLLM's order:
//!   `["BlockStored", [hash], parent_block_hash (nil), token_ids ([]), block_size, lora_id (nil), medium]`,
//!   `["BlockRemoved", [hash], medium]`, `["AllBlocksCleared"]`.
//! - [`KvEncoding::Map`] (by name; current vLLM): the batch is
//!   `{"ts", "events", "data_parallel_rank"}`, each event a map whose first entry is
//!   `"type": tag`, then its fields by vLLM's current names (`BlockStored` adds `lora_name`).
//!
//! Everything is written into the caller's reused buffer: no allocation per batch or event.

use rmp::encode;

use super::{KvEncoding, KvEvent};

/// Encodes one batch into `out` (cleared first). `block_size` is reported in `BlockStored`
/// (token ids are not known to this server: the list is empty).
pub fn batch(
    out: &mut Vec<u8>,
    encoding: KvEncoding,
    ts: f64,
    events: &[KvEvent],
    data_parallel_rank: i64,
    block_size: u64,
) {
    out.clear();
    // Writing into a Vec cannot fail.
    match encoding {
        KvEncoding::Array => {
            let _ = encode::write_array_len(out, 3);
            let _ = encode::write_f64(out, ts);
            let _ = encode::write_array_len(out, events.len() as u32);
            for e in events {
                positional_event(out, e, block_size);
            }
        }
        KvEncoding::Map => {
            let _ = encode::write_map_len(out, 3);
            str(out, "ts");
            let _ = encode::write_f64(out, ts);
            str(out, "events");
            let _ = encode::write_array_len(out, events.len() as u32);
            for e in events {
                named_event(out, e, block_size);
            }
            str(out, "data_parallel_rank");
        }
    }
    let _ = encode::write_sint(out, data_parallel_rank);
}

fn str(out: &mut Vec<u8>, s: &str) {
    let _ = encode::write_str(out, s);
}

fn one_hash(out: &mut Vec<u8>, hash: u64) {
    let _ = encode::write_array_len(out, 1);
    let _ = encode::write_uint(out, hash);
}

/// An event as a tag-first array, fields in vLLM's declaration order.
fn positional_event(out: &mut Vec<u8>, e: &KvEvent, block_size: u64) {
    match *e {
        KvEvent::Stored { hash, medium } => {
            let _ = encode::write_array_len(out, 7);
            str(out, "BlockStored");
            one_hash(out, hash); // block_hashes
            let _ = encode::write_nil(out); // parent_block_hash
            let _ = encode::write_array_len(out, 0); // token_ids
            let _ = encode::write_uint(out, block_size);
            let _ = encode::write_nil(out); // lora_id
            str(out, medium.kv_event());
        }
        KvEvent::Removed { hash, medium } => {
            let _ = encode::write_array_len(out, 3);
            str(out, "BlockRemoved");
            one_hash(out, hash);
            str(out, medium.kv_event());
        }
        KvEvent::Cleared => {
            let _ = encode::write_array_len(out, 1);
            str(out, "AllBlocksCleared");
        }
    }
}

/// A block event's map of `fields` entries up to its `block_hashes` (`"type"` first).
fn named_head(out: &mut Vec<u8>, fields: u32, tag: &str, hash: u64) {
    let _ = encode::write_map_len(out, fields);
    str(out, "type");
    str(out, tag);
    str(out, "block_hashes");
    one_hash(out, hash);
}

/// An event as a map: `"type"` first, then vLLM's current field names in its order.
fn named_event(out: &mut Vec<u8>, e: &KvEvent, block_size: u64) {
    match *e {
        KvEvent::Stored { hash, medium } => {
            named_head(out, 8, "BlockStored", hash);
            str(out, "parent_block_hash");
            let _ = encode::write_nil(out);
            str(out, "token_ids");
            let _ = encode::write_array_len(out, 0);
            str(out, "block_size");
            let _ = encode::write_uint(out, block_size);
            str(out, "lora_id");
            let _ = encode::write_nil(out);
            str(out, "medium");
            str(out, medium.kv_event());
            str(out, "lora_name");
            let _ = encode::write_nil(out);
        }
        KvEvent::Removed { hash, medium } => {
            named_head(out, 3, "BlockRemoved", hash);
            str(out, "medium");
            str(out, medium.kv_event());
        }
        KvEvent::Cleared => {
            let _ = encode::write_map_len(out, 1);
            str(out, "type");
            str(out, "AllBlocksCleared");
        }
    }
}

/// A generic msgpack value, for tests that read a payload back as a consumer would.
#[cfg(test)]
#[derive(Debug, PartialEq)]
pub(crate) enum V {
    Nil,
    U(u64),
    I(i64),
    F(f64),
    S(String),
    A(Vec<V>),
    M(Vec<(V, V)>),
}

/// Decodes one complete msgpack value with a consumer's decoder (`rmpv`) and checks that
/// nothing trails it; the kinds a KV-event payload may not hold (binary, f32, extensions)
/// fail the test.
#[cfg(test)]
pub(crate) fn decode_value(mut bytes: &[u8]) -> V {
    fn of(v: rmpv::Value) -> V {
        use rmpv::Value;
        match v {
            Value::Nil => V::Nil,
            Value::Integer(i) => i.as_u64().map_or_else(|| V::I(i.as_i64().unwrap()), V::U),
            Value::F64(f) => V::F(f),
            Value::String(s) => V::S(s.into_str().expect("UTF-8")),
            Value::Array(a) => V::A(a.into_iter().map(of).collect()),
            Value::Map(m) => V::M(m.into_iter().map(|(k, v)| (of(k), of(v))).collect()),
            other => panic!("unexpected msgpack value {other:?}"),
        }
    }
    let v = rmpv::decode::read_value(&mut bytes).expect("one msgpack value");
    assert!(bytes.is_empty(), "{} bytes after the value", bytes.len());
    of(v)
}

#[cfg(test)]
mod tests {
    use super::V::*;
    use super::*;
    use crate::common::medium::Medium;

    fn s(x: &str) -> V {
        S(x.to_string())
    }

    fn events() -> [KvEvent; 3] {
        [
            KvEvent::Stored {
                hash: u64::MAX,
                medium: Medium::Dram,
            },
            KvEvent::Removed {
                hash: 7,
                medium: Medium::Ssd,
            },
            KvEvent::Cleared,
        ]
    }

    #[test]
    fn positional_batches_are_arrays_of_tag_first_arrays() {
        let mut out = Vec::new();
        batch(&mut out, KvEncoding::Array, 1.5, &events(), 3, 256);
        assert_eq!(
            decode_value(&out),
            A(vec![
                F(1.5),
                A(vec![
                    A(vec![
                        s("BlockStored"),
                        A(vec![U(u64::MAX)]),
                        Nil,
                        A(vec![]),
                        U(256),
                        Nil,
                        s("CPU"),
                    ]),
                    A(vec![s("BlockRemoved"), A(vec![U(7)]), s("DISK")]),
                    A(vec![s("AllBlocksCleared")]),
                ]),
                U(3),
            ])
        );
    }

    #[test]
    fn named_batches_are_maps_of_type_tagged_maps() {
        let mut out = Vec::new();
        batch(&mut out, KvEncoding::Map, 1.5, &events(), 3, 256);
        let m = |kv: Vec<(&str, V)>| M(kv.into_iter().map(|(k, v)| (s(k), v)).collect());
        assert_eq!(
            decode_value(&out),
            m(vec![
                ("ts", F(1.5)),
                (
                    "events",
                    A(vec![
                        m(vec![
                            ("type", s("BlockStored")),
                            ("block_hashes", A(vec![U(u64::MAX)])),
                            ("parent_block_hash", Nil),
                            ("token_ids", A(vec![])),
                            ("block_size", U(256)),
                            ("lora_id", Nil),
                            ("medium", s("CPU")),
                            ("lora_name", Nil),
                        ]),
                        m(vec![
                            ("type", s("BlockRemoved")),
                            ("block_hashes", A(vec![U(7)])),
                            ("medium", s("DISK")),
                        ]),
                        m(vec![("type", s("AllBlocksCleared"))]),
                    ])
                ),
                ("data_parallel_rank", U(3)),
            ])
        );
    }

    #[test]
    fn a_buffer_is_reused_and_large_batches_use_wide_lengths() {
        let mut out = Vec::new();
        let many: Vec<KvEvent> = (0..70_000u64)
            .map(|h| KvEvent::Removed {
                hash: h,
                medium: Medium::Hbm,
            })
            .collect();
        for enc in [KvEncoding::Array, KvEncoding::Map] {
            batch(&mut out, enc, 2.0, &many, 0, 16);
            let cap = out.capacity();
            let events = match decode_value(&out) {
                A(mut v) => v.swap_remove(1),
                M(mut v) => v.swap_remove(1).1,
                other => panic!("{other:?}"),
            };
            let A(events) = events else { panic!() };
            assert_eq!(events.len(), 70_000);
            // A second, smaller batch into the same buffer replaces the first without growing it.
            batch(&mut out, enc, 2.0, &[KvEvent::Cleared], 0, 16);
            assert_eq!(out.capacity(), cap);
            assert!(matches!(decode_value(&out), A(_) | M(_)));
        }
    }
}
