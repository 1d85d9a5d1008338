//! The `/metadata` store of one shard: raw values under raw keys, bounded in total size.

use bytes::Bytes;
use hashbrown::HashMap;

use super::command::Reply;
use crate::common::error_kind::ErrorKind;

/// Bytes charged per entry beyond key and value: the map slot and the value's allocation
/// header, so that many tiny entries cannot exceed the memory budget unnoticed.
const ENTRY_OVERHEAD_BYTES: u64 = 64;

pub struct MetadataStore {
    /// Seeded per process (foldhash's random state), so a client cannot choose keys that all
    /// collide in one bucket.
    map: HashMap<Box<[u8]>, Bytes, foldhash::fast::RandomState>,
    bytes_used: u64,
    /// Bytes held for writes on their way to etcd (HA on): counted against the budget so a
    /// write etcd accepted always fits when it comes back to be applied.
    bytes_reserved: u64,
    /// This shard's share of `ock.mmc.metadata.max_total_bytes`.
    bytes_max: u64,
}

impl MetadataStore {
    pub fn new(bytes_max: u64) -> MetadataStore {
        MetadataStore {
            map: HashMap::default(),
            bytes_used: 0,
            bytes_reserved: 0,
            bytes_max,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    pub fn get(&self, key: &[u8]) -> Reply {
        match self.map.get(key) {
            Some(v) => Reply::Value(v.clone()),
            None => Reply::NotFound,
        }
    }

    pub fn put(&mut self, key: Box<[u8]>, value: Bytes) -> Reply {
        let new_cost = cost(&key, &value);
        let old_cost = self.map.get(&key).map_or(0, |old| cost(&key, old));
        if self.bytes_used - old_cost + new_cost + self.bytes_reserved > self.bytes_max {
            return Reply::refused(ErrorKind::NoSpace, "Metadata store full");
        }
        self.bytes_used = self.bytes_used - old_cost + new_cost;
        self.map.insert(key, value);
        Reply::Done
    }

    /// The cost a put of `key` with a value of `value_len` bytes is charged.
    pub fn put_cost(key: &[u8], value_len: usize) -> u64 {
        key.len() as u64 + value_len as u64 + ENTRY_OVERHEAD_BYTES
    }

    /// Holds `bytes` of the budget for a write on its way to etcd; false when they do not fit.
    pub fn reserve(&mut self, bytes: u64) -> bool {
        if self.bytes_used + self.bytes_reserved + bytes > self.bytes_max {
            return false;
        }
        self.bytes_reserved += bytes;
        true
    }

    pub fn unreserve(&mut self, bytes: u64) {
        self.bytes_reserved = self.bytes_reserved.saturating_sub(bytes);
    }

    /// Drops every entry (a new leader reloads them from etcd). Reservations stay.
    pub fn clear(&mut self) {
        self.map.clear();
        self.bytes_used = 0;
    }

    pub fn delete(&mut self, key: &[u8]) -> Reply {
        match self.map.remove_entry(key) {
            Some((k, v)) => {
                self.bytes_used -= cost(&k, &v);
                Reply::Done
            }
            None => Reply::NotFound,
        }
    }
}

fn cost(key: &[u8], value: &Bytes) -> u64 {
    MetadataStore::put_cost(key, value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &[u8]) -> Box<[u8]> {
        k.to_vec().into_boxed_slice()
    }

    #[test]
    fn put_get_delete_and_accounting() {
        let mut m = MetadataStore::new(1024);
        assert!(matches!(m.get(b"k"), Reply::NotFound));
        assert!(matches!(
            m.put(key(b"k"), Bytes::from_static(b"\0\xffv")),
            Reply::Done
        ));
        assert!(matches!(m.get(b"k"), Reply::Value(v) if v == Bytes::from_static(b"\0\xffv")));
        assert_eq!(m.bytes_used(), 1 + 3 + ENTRY_OVERHEAD_BYTES);
        assert!(matches!(
            m.put(key(b"k"), Bytes::from_static(b"vv")),
            Reply::Done
        ));
        assert_eq!(m.bytes_used(), 1 + 2 + ENTRY_OVERHEAD_BYTES);
        assert!(matches!(m.delete(b"k"), Reply::Done));
        assert_eq!(m.bytes_used(), 0);
        assert!(matches!(m.delete(b"k"), Reply::NotFound));
    }

    #[test]
    fn refuses_past_its_budget_and_keeps_the_old_value() {
        let mut m = MetadataStore::new(200);
        assert!(matches!(
            m.put(key(b"a"), Bytes::from(vec![1; 100])),
            Reply::Done
        ));
        let r = m.put(key(b"b"), Bytes::from(vec![2; 150]));
        assert!(
            matches!(r, Reply::Refused(ref why) if why.message == "Metadata store full" && why.kind == ErrorKind::NoSpace),
            "{r:?}"
        );
        assert!(matches!(m.get(b"b"), Reply::NotFound));
        // Replacing a value only charges the difference.
        assert!(matches!(
            m.put(key(b"a"), Bytes::from(vec![3; 130])),
            Reply::Done
        ));
        assert_eq!(m.len(), 1);
    }
}
