//! The catalog hand-over on the wire (`shards/catalog.rs`), between a local service and its
//! meta: an entry is `[key_hex, medium, offset, len, size, view, seq]` (medium as in a grant:
//! 0 HBM, 1 DRAM), a freed record `[log_seq, medium, offset, view, seq]`.

use serde_json::{Value, json};

use crate::grant::{hex, unhex};
use crate::shards::catalog::{BeatNews, Entry, Freed, Stamp};
use crate::shards::store::segment::Medium;

fn medium_of(v: &Value) -> Option<Medium> {
    let m = v.as_u64()? as usize;
    Medium::ALL.get(m).copied().filter(|m| m.is_memory())
}

pub fn entry_json(e: &Entry) -> Value {
    json!([
        hex(&e.key),
        e.medium as u8,
        e.offset,
        e.len,
        e.size,
        e.stamp.view,
        e.stamp.seq
    ])
}

pub fn parse_entry(v: &Value) -> Option<Entry> {
    let a = v.as_array().filter(|a| a.len() == 7)?;
    let key = unhex(a[0].as_str()?).filter(|k| !k.is_empty())?;
    Some(Entry {
        key: key.into(),
        medium: medium_of(&a[1])?,
        offset: a[2].as_u64()?,
        len: a[3].as_u64()?,
        size: a[4].as_u64()?,
        stamp: Stamp {
            view: a[5].as_u64()?,
            seq: a[6].as_u64()?,
        },
    })
}

/// A list of entries; `None` when any is malformed.
pub fn parse_entries(v: Option<&Value>) -> Option<Vec<Entry>> {
    match v {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(parse_entry).collect(),
        Some(_) => None,
    }
}

pub fn freed_json(seq: u64, f: &Freed) -> Value {
    json!([seq, f.medium as u8, f.offset, f.stamp.view, f.stamp.seq])
}

fn parse_freed(v: &Value) -> Option<(u64, Freed)> {
    let a = v.as_array().filter(|a| a.len() == 5)?;
    Some((
        a[0].as_u64()?,
        Freed {
            medium: medium_of(&a[1])?,
            offset: a[2].as_u64()?,
            stamp: Stamp {
                view: a[3].as_u64()?,
                seq: a[4].as_u64()?,
            },
        },
    ))
}

/// The catalog part of a heartbeat answer: `catalog_seq`, `freed` and, on a resync,
/// `resync: true` with the full `catalog`. `None` when the meta sent none (or a malformed one).
pub fn parse_news(v: &Value) -> Option<BeatNews> {
    let seq = v.get("catalog_seq")?.as_u64()?;
    let freed = match v.get("freed") {
        None => Vec::new(),
        Some(f) => f
            .as_array()?
            .iter()
            .map(parse_freed)
            .collect::<Option<Vec<_>>>()?,
    };
    let resync = if v.get("resync").and_then(Value::as_bool) == Some(true) {
        Some(parse_entries(v.get("catalog"))?)
    } else {
        None
    };
    Some(BeatNews { seq, freed, resync })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_news_round_trip() {
        let e = Entry {
            key: b"k\x00\xff".as_slice().into(),
            medium: Medium::Dram,
            offset: 8192,
            len: 4096,
            size: 100,
            stamp: Stamp { view: 7, seq: 9 },
        };
        assert_eq!(parse_entry(&entry_json(&e)), Some(e.clone()));
        let f = Freed {
            medium: Medium::Hbm,
            offset: 4096,
            stamp: Stamp { view: 1, seq: 2 },
        };
        let v = json!({"catalog_seq": 5, "freed": [freed_json(5, &f)], "resync": true,
            "catalog": [entry_json(&e)]});
        assert_eq!(
            parse_news(&v),
            Some(BeatNews {
                seq: 5,
                freed: vec![(5, f)],
                resync: Some(vec![e])
            })
        );
        // SSD, a bad key or a short array is refused.
        assert!(parse_entry(&json!(["6b", 2, 0, 4096, 1, 0, 0])).is_none());
        assert!(parse_entry(&json!(["zz", 1, 0, 4096, 1, 0, 0])).is_none());
        assert!(parse_entry(&json!(["6b", 1, 0, 4096, 1, 0])).is_none());
        assert!(parse_news(&json!({"success": true})).is_none());
    }
}
