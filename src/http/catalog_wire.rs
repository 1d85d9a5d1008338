//! The catalog hand-over on the wire (`shards/store/catalog.rs`), between a local service and its
//! meta: an entry is `[key_hex, medium, offset, len, size, view, seq]` (medium as in a grant:
//! 0 HBM, 1 DRAM, 2 SSD), an SSD entry with an eighth element, its checksum (a memory entry
//! keeps the seven of before); a freed record `[log_seq, medium, offset, view, seq]`, in the
//! heartbeat answer's `freed` list, or, for a tier move the meta made readable, in its
//! `landed` list (the same form; the two lists share the log's sequence numbers).

use serde_json::{Value, json};

use crate::cluster::catalog::{BeatNews, Entry, Freed, Stamp};
use crate::grant::{hex, unhex};
use crate::shards::store::segment::Medium;

fn medium_of(v: &Value) -> Option<Medium> {
    let m = v.as_u64()? as usize;
    Medium::ALL.get(m).copied()
}

pub fn entry_json(e: &Entry) -> Value {
    let mut v = json!([
        hex(&e.key),
        e.medium as u8,
        e.offset,
        e.len,
        e.size,
        e.stamp.view,
        e.stamp.seq
    ]);
    if e.medium == Medium::Ssd
        && let Some(a) = v.as_array_mut()
    {
        a.push(json!(e.sum));
    }
    v
}

pub fn parse_entry(v: &Value) -> Option<Entry> {
    let a = v.as_array().filter(|a| a.len() == 7 || a.len() == 8)?;
    let key = unhex(a[0].as_str()?).filter(|k| !k.is_empty())?;
    let medium = medium_of(&a[1])?;
    // An SSD copy carries its checksum (its reads are checked against it); memory none.
    let sum = match (medium, a.get(7)) {
        (Medium::Ssd, Some(s)) => s.as_u64()?,
        (Medium::Ssd, None) => return None,
        (_, None) => 0,
        (_, Some(s)) => s.as_u64().filter(|&s| s == 0)?,
    };
    Some(Entry {
        key: key.into(),
        medium,
        offset: a[2].as_u64()?,
        len: a[3].as_u64()?,
        size: a[4].as_u64()?,
        stamp: Stamp {
            view: a[5].as_u64()?,
            seq: a[6].as_u64()?,
        },
        sum,
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

/// The news of a freed log up to `seq` (a heartbeat's answer, a push's body): freed records
/// and landed tier moves in their own lists (the local merges them by sequence).
pub fn news_json(seq: u64, records: &[(u64, Freed)]) -> Value {
    let (landed, freed): (Vec<_>, Vec<_>) = records.iter().partition(|(_, f)| f.landed);
    let list = |l: Vec<&(u64, Freed)>| -> Vec<Value> {
        l.iter().map(|(s, f)| freed_json(*s, f)).collect()
    };
    let mut v = json!({"catalog_seq": seq, "freed": list(freed)});
    if !landed.is_empty() {
        v["landed"] = Value::Array(list(landed));
    }
    v
}

fn parse_freed(v: &Value, landed: bool) -> Option<(u64, Freed)> {
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
            landed,
        },
    ))
}

/// The catalog part of a heartbeat answer: `catalog_seq`, `freed`, `landed` and, on a
/// resync, `resync: true` with the full `catalog`. `None` when the meta sent none (or a
/// malformed one). The records of both lists come back in the log's order.
pub fn parse_news(v: &Value) -> Option<BeatNews> {
    let seq = v.get("catalog_seq")?.as_u64()?;
    let list = |name: &str, landed: bool| match v.get(name) {
        None => Some(Vec::new()),
        Some(f) => f
            .as_array()?
            .iter()
            .map(|r| parse_freed(r, landed))
            .collect::<Option<Vec<_>>>(),
    };
    let mut freed = list("freed", false)?;
    freed.extend(list("landed", true)?);
    freed.sort_by_key(|r| r.0);
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
            sum: 0,
        };
        assert_eq!(parse_entry(&entry_json(&e)), Some(e.clone()));
        assert_eq!(entry_json(&e).as_array().unwrap().len(), 7, "as before");
        let ssd = Entry {
            medium: Medium::Ssd,
            sum: u64::MAX - 3,
            ..e.clone()
        };
        assert_eq!(entry_json(&ssd)[7], json!(u64::MAX - 3));
        assert_eq!(parse_entry(&entry_json(&ssd)), Some(ssd.clone()));
        let f = Freed {
            medium: Medium::Hbm,
            offset: 4096,
            stamp: Stamp { view: 1, seq: 2 },
            landed: false,
        };
        let l = Freed {
            medium: Medium::Ssd,
            landed: true,
            ..f
        };
        let v = json!({"catalog_seq": 6, "freed": [freed_json(4, &f), freed_json(6, &f)],
            "landed": [freed_json(5, &l)], "resync": true, "catalog": [entry_json(&e)]});
        assert_eq!(
            parse_news(&v),
            Some(BeatNews {
                seq: 6,
                freed: vec![(4, f), (5, l), (6, f)],
                resync: Some(vec![e])
            })
        );
        // An SSD entry without its checksum, a memory one with one, a bad key or a short
        // array is refused.
        assert!(parse_entry(&json!(["6b", 2, 0, 4096, 1, 0, 0])).is_none());
        assert!(parse_entry(&json!(["6b", 1, 0, 4096, 1, 0, 0, 5])).is_none());
        assert!(parse_entry(&json!(["6b", 3, 0, 4096, 1, 0, 0])).is_none());
        assert!(parse_entry(&json!(["zz", 1, 0, 4096, 1, 0, 0])).is_none());
        assert!(parse_entry(&json!(["6b", 1, 0, 4096, 1, 0])).is_none());
        assert!(parse_news(&json!({"success": true})).is_none());
    }
}
