//! The KV-event wire encoding: one msgpack `EventBatch` per message, in the shape of the
//! consumer generation `ock.mmc.kv_events.encoding` names ([`KvEncoding`]). Real consumers
//! decode with typed msgspec / Go decoders, so each generation's shape is written exactly.
//!
//! | Encoding | Batch | `BlockStored` | `BlockRemoved` |
//! |---|---|---|---|
//! | `vllm-0.9` | `[ts, events, dp_rank]` | `[tag, hashes, parent, token_ids, block_size, lora_id]` | `[tag, hashes]` |
//! | `array` (`vllm-0.10`) | `[ts, events, dp_rank]` | `[…, lora_id, medium]` | `[tag, hashes, medium]` |
//! | `vllm-0.14` | `[ts, events, dp_rank]` | `[…, lora_id, medium, lora_name]` | `[tag, hashes, medium]` |
//! | `vllm-0.24`, `sglang` | `[ts, events, dp_rank]` | `{"type", "block_hashes", …, "lora_name"}` | `{"type", "block_hashes", "medium"}` |
//! | `map` (`vllm-main`) | `{"ts", "events", "data_parallel_rank"}` | as `vllm-0.24` | as `vllm-0.24` |
//!
//! `AllBlocksCleared` is `["AllBlocksCleared"]` in the positional forms and
//! `{"type": "AllBlocksCleared"}` in the others; `sglang` writes SGLang's medium names.
//!
//! Everything is written into the caller's reused buffer: no allocation per batch or event.

use rmp::encode;

use super::{KvEncoding, KvEvent};
use crate::common::medium::Medium;

/// How one generation writes an event.
#[derive(Clone, Copy)]
enum EventShape {
    /// Tag-first arrays: `BlockStored` with this many fields after the tag (5, 6 or 7: through
    /// `lora_id`, `medium`, `lora_name`), `BlockRemoved` with `medium` or not.
    Positional {
        stored_fields: u32,
        removed_medium: bool,
    },
    /// Maps tagged by `"type"`, with this medium naming.
    Named { sglang_media: bool },
}

impl EventShape {
    fn of(encoding: KvEncoding) -> EventShape {
        match encoding {
            KvEncoding::Vllm09 => EventShape::Positional {
                stored_fields: 5,
                removed_medium: false,
            },
            KvEncoding::Array => EventShape::Positional {
                stored_fields: 6,
                removed_medium: true,
            },
            KvEncoding::Vllm014 => EventShape::Positional {
                stored_fields: 7,
                removed_medium: true,
            },
            KvEncoding::Vllm024 | KvEncoding::Map => EventShape::Named {
                sglang_media: false,
            },
            KvEncoding::Sglang => EventShape::Named { sglang_media: true },
        }
    }
}

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
    let shape = EventShape::of(encoding);
    // Writing into a Vec cannot fail.
    if encoding == KvEncoding::Map {
        let _ = encode::write_map_len(out, 3);
        str(out, "ts");
        let _ = encode::write_f64(out, ts);
        str(out, "events");
    } else {
        let _ = encode::write_array_len(out, 3);
        let _ = encode::write_f64(out, ts);
    }
    let _ = encode::write_array_len(out, events.len() as u32);
    for e in events {
        match shape {
            EventShape::Positional {
                stored_fields,
                removed_medium,
            } => positional_event(out, e, block_size, stored_fields, removed_medium),
            EventShape::Named { sglang_media } => named_event(out, e, block_size, sglang_media),
        }
    }
    if encoding == KvEncoding::Map {
        str(out, "data_parallel_rank");
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

/// An event as a tag-first array, fields in vLLM's declaration order, as many as the
/// generation declares.
fn positional_event(
    out: &mut Vec<u8>,
    e: &KvEvent,
    block_size: u64,
    stored_fields: u32,
    removed_medium: bool,
) {
    match *e {
        KvEvent::Stored { hash, medium } => {
            let _ = encode::write_array_len(out, 1 + stored_fields);
            str(out, "BlockStored");
            one_hash(out, hash); // block_hashes
            let _ = encode::write_nil(out); // parent_block_hash
            let _ = encode::write_array_len(out, 0); // token_ids
            let _ = encode::write_uint(out, block_size);
            let _ = encode::write_nil(out); // lora_id
            if stored_fields >= 6 {
                str(out, medium.kv_event());
            }
            if stored_fields >= 7 {
                let _ = encode::write_nil(out); // lora_name
            }
        }
        KvEvent::Removed { hash, medium } => {
            let _ = encode::write_array_len(out, if removed_medium { 3 } else { 2 });
            str(out, "BlockRemoved");
            one_hash(out, hash);
            if removed_medium {
                str(out, medium.kv_event());
            }
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

fn medium_name(medium: Medium, sglang: bool) -> &'static str {
    if sglang {
        medium.sglang_kv_event()
    } else {
        medium.kv_event()
    }
}

/// An event as a map: `"type"` first, then the fields by name in vLLM's order (the optional
/// ones, which vLLM and SGLang omit at their defaults, left out).
fn named_event(out: &mut Vec<u8>, e: &KvEvent, block_size: u64, sglang: bool) {
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
            str(out, medium_name(medium, sglang));
            str(out, "lora_name");
            let _ = encode::write_nil(out);
        }
        KvEvent::Removed { hash, medium } => {
            named_head(out, 3, "BlockRemoved", hash);
            str(out, "medium");
            str(out, medium_name(medium, sglang));
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

    fn m(kv: Vec<(&str, V)>) -> V {
        M(kv.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    /// `events()` as the by-name generations write them (DRAM named `cpu`).
    fn named_events(cpu: &str) -> Vec<V> {
        vec![
            m(vec![
                ("type", s("BlockStored")),
                ("block_hashes", A(vec![U(u64::MAX)])),
                ("parent_block_hash", Nil),
                ("token_ids", A(vec![])),
                ("block_size", U(256)),
                ("lora_id", Nil),
                ("medium", s(cpu)),
                ("lora_name", Nil),
            ]),
            m(vec![
                ("type", s("BlockRemoved")),
                ("block_hashes", A(vec![U(7)])),
                ("medium", s("DISK")),
            ]),
            m(vec![("type", s("AllBlocksCleared"))]),
        ]
    }

    #[test]
    fn named_batches_are_maps_of_type_tagged_maps() {
        let mut out = Vec::new();
        batch(&mut out, KvEncoding::Map, 1.5, &events(), 3, 256);
        assert_eq!(
            decode_value(&out),
            m(vec![
                ("ts", F(1.5)),
                ("events", A(named_events("CPU"))),
                ("data_parallel_rank", U(3)),
            ])
        );
    }

    #[test]
    fn each_positional_generation_has_its_own_slots() {
        let stored = |n: usize| {
            let mut v = vec![
                s("BlockStored"),
                A(vec![U(u64::MAX)]),
                Nil,
                A(vec![]),
                U(256),
                Nil,
                s("CPU"),
                Nil,
            ];
            v.truncate(n);
            A(v)
        };
        for (enc, slots, removed) in [
            (KvEncoding::Vllm09, 6, 2),
            (KvEncoding::Array, 7, 3),
            (KvEncoding::Vllm014, 8, 3),
        ] {
            let mut out = Vec::new();
            batch(&mut out, enc, 1.5, &events(), 3, 256);
            let mut rem = vec![s("BlockRemoved"), A(vec![U(7)]), s("DISK")];
            rem.truncate(removed);
            assert_eq!(
                decode_value(&out),
                A(vec![
                    F(1.5),
                    A(vec![stored(slots), A(rem), A(vec![s("AllBlocksCleared")])]),
                    U(3),
                ]),
                "{enc:?}"
            );
        }
    }

    #[test]
    fn vllm_024_and_sglang_send_named_events_in_a_positional_batch() {
        for (enc, cpu) in [
            (KvEncoding::Vllm024, "CPU"),
            (KvEncoding::Sglang, "CPU_PINNED"),
        ] {
            let mut out = Vec::new();
            batch(&mut out, enc, 1.5, &events(), 3, 256);
            assert_eq!(
                decode_value(&out),
                A(vec![F(1.5), A(named_events(cpu)), U(3)]),
                "{enc:?}"
            );
        }
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
        for enc in [
            KvEncoding::Vllm09,
            KvEncoding::Array,
            KvEncoding::Vllm014,
            KvEncoding::Vllm024,
            KvEncoding::Sglang,
            KvEncoding::Map,
        ] {
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
