//! The SSD file's journal: the index of the blobs in `mmc-rank-<r>.ssd`, kept beside it in
//! `mmc-rank-<r>.ssd.journal`, so that a start on the same path finds them again.
//!
//! The journal is append-only. It opens with a header (magic, the segment's capacity, a
//! checksum) and then holds records, each framed as `[payload length u32][xxh3-64 of the
//! length and the payload][payload]`, so that a crash at any moment leaves a readable prefix:
//! [`replay`] stops at the first record that is cut short or does not match its checksum (a
//! torn tail, a damaged sector) and ignores everything from there.
//!
//! Three records:
//! - `Add`: a blob became readable at `[offset, offset + len)` (its flush landed): the key,
//!   the object's size, the checksum of its bytes, its stamp, the shard that wrote it.
//! - `Remove`: the blob at `offset` with this stamp left its object (a removal, an eviction,
//!   a damaged copy dropped). A removal whose stamp does not match the entry there is ignored:
//!   the range was reused by a later blob whose `Add` came first.
//! - `Clear`: every entry a shard journaled before is gone (its `remove_all`).
//!
//! Replaying an `Add` drops the entries whose ranges it overlaps: the store gives a range to a
//! new blob only after the old one was freed, so an overlap means the old one is gone, whether
//! or not its `Remove` reached the journal. Whatever the records say, a recovered blob is
//! served only when its bytes match the checksum its `Add` carries (see `ssd/recover.rs`).
//!
//! The journal is rewritten whole (a *snapshot*: the header and one `Add` per live entry) at
//! every start and whenever it grows past twice its last snapshot (`ssd/journaling.rs`); a
//! snapshot replaces the file atomically (written beside it, synced, renamed over it).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::cluster::catalog::{Entry, Stamp};
use crate::common::medium::Medium;

/// The journal's first eight bytes (the last one is the format's version).
pub const MAGIC: &[u8; 8] = b"MMCJRNL\x01";
/// Magic, capacity, reserved, checksum of the 24 bytes before it.
pub const HEADER_BYTES: usize = 32;
/// The frame before a record's payload: its length and its checksum.
const FRAME_BYTES: usize = 12;
/// No payload is longer (an `Add` with the longest key is about 4.2 KB): a longer length
/// read from the file is damage, not a record.
pub const MAX_PAYLOAD_BYTES: usize = 8192;

const ADD: u8 = 1;
const REMOVE: u8 = 2;
const CLEAR: u8 = 3;

/// One journal record. `shard` is the shard that journaled it (a `Clear` applies to its
/// entries only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Add {
        shard: u16,
        entry: Entry,
    },
    Remove {
        shard: u16,
        offset: u64,
        stamp: Stamp,
    },
    Clear {
        shard: u16,
    },
}

/// The journal file beside an SSD file.
pub fn path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

/// The header of a journal for a segment of `capacity` bytes.
pub fn header(capacity: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&capacity.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&h[..24]);
    h[24..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Appends `rec`, framed, to `out`.
pub fn encode(rec: &Record, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_BYTES]);
    let (tag, shard) = match rec {
        Record::Add { shard, .. } => (ADD, *shard),
        Record::Remove { shard, .. } => (REMOVE, *shard),
        Record::Clear { shard } => (CLEAR, *shard),
    };
    out.push(tag);
    out.extend_from_slice(&shard.to_le_bytes());
    match rec {
        Record::Add { entry: e, .. } => {
            for v in [e.offset, e.len, e.size, e.sum, e.stamp.view, e.stamp.seq] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&e.key);
        }
        Record::Remove { offset, stamp, .. } => {
            for v in [*offset, stamp.view, stamp.seq] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Record::Clear { .. } => {}
    }
    let len = (out.len() - start - FRAME_BYTES) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let sum = frame_sum(&out[start..start + 4], &out[start + FRAME_BYTES..]);
    out[start + 4..start + FRAME_BYTES].copy_from_slice(&sum.to_le_bytes());
}

fn frame_sum(len: &[u8], payload: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(len);
    h.update(payload);
    h.digest()
}

/// Reads one payload; `None` when it is malformed (which a checksum-valid record never is,
/// unless written by another version).
fn decode(p: &[u8]) -> Option<Record> {
    let (&tag, rest) = p.split_first()?;
    let shard = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?);
    let rest = &rest[2..];
    let u = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            rest.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    match tag {
        ADD => {
            let key = rest.get(48..)?;
            if key.is_empty() || key.len() > crate::limits::MAX_KEY_BYTES {
                return None;
            }
            Some(Record::Add {
                shard,
                entry: Entry {
                    key: key.into(),
                    medium: Medium::Ssd,
                    offset: u(0)?,
                    len: u(1)?,
                    size: u(2)?,
                    sum: u(3)?,
                    stamp: Stamp {
                        view: u(4)?,
                        seq: u(5)?,
                    },
                },
            })
        }
        REMOVE if rest.len() == 24 => Some(Record::Remove {
            shard,
            offset: u(0)?,
            stamp: Stamp {
                view: u(1)?,
                seq: u(2)?,
            },
        }),
        CLEAR if rest.is_empty() => Some(Record::Clear { shard }),
        _ => None,
    }
}

/// A live entry of a replayed journal: the blob and the shard that journaled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub shard: u16,
    pub entry: Entry,
}

/// What a journal says, replayed.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The live blobs by offset (their ranges never overlap).
    pub entries: BTreeMap<u64, Live>,
    /// The capacity in the header; `None` when the header is unreadable (nothing was read).
    pub capacity: Option<u64>,
    /// Intact records read.
    pub records: u64,
    /// Bytes from the first record that is cut short or damaged to the end: ignored.
    pub tail_bytes: u64,
}

impl Replayed {
    /// Applies one record (see the module's rules).
    pub fn apply(&mut self, rec: Record) {
        match rec {
            Record::Add { shard, entry } => {
                let end = entry.offset.saturating_add(entry.len.max(1));
                let overlapping: Vec<u64> = self
                    .entries
                    .range(..end)
                    .rev()
                    .take_while(|(_, l)| {
                        l.entry.offset.saturating_add(l.entry.len.max(1)) > entry.offset
                    })
                    .map(|(&o, _)| o)
                    .collect();
                for o in overlapping {
                    self.entries.remove(&o);
                }
                self.entries.insert(entry.offset, Live { shard, entry });
            }
            Record::Remove { offset, stamp, .. } => {
                if self
                    .entries
                    .get(&offset)
                    .is_some_and(|l| l.entry.stamp == stamp)
                {
                    self.entries.remove(&offset);
                }
            }
            Record::Clear { shard } => self.entries.retain(|_, l| l.shard != shard),
        }
    }
}

/// Replays a journal's bytes: never fails (a damaged journal is input). An unreadable header
/// yields nothing; a record cut short or not matching its checksum ends the replay there.
pub fn replay(bytes: &[u8]) -> Replayed {
    let mut r = Replayed::default();
    let Some(h) = bytes.get(..HEADER_BYTES) else {
        r.tail_bytes = bytes.len() as u64;
        return r;
    };
    let sum = u64::from_le_bytes(h[24..].try_into().expect("8 bytes"));
    if &h[..8] != MAGIC || xxhash_rust::xxh3::xxh3_64(&h[..24]) != sum {
        r.tail_bytes = bytes.len() as u64;
        return r;
    }
    r.capacity = Some(u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")));
    let mut at = HEADER_BYTES;
    while at < bytes.len() {
        match next_record(&bytes[at..]) {
            Some((rec, used)) => {
                r.apply(rec);
                r.records += 1;
                at += used;
            }
            None => break,
        }
    }
    r.tail_bytes = (bytes.len() - at) as u64;
    r
}

/// The record at the start of `b` and the bytes it takes; `None` when it is cut short,
/// damaged or malformed.
fn next_record(b: &[u8]) -> Option<(Record, usize)> {
    let frame = b.get(..FRAME_BYTES)?;
    let len = u32::from_le_bytes(frame[..4].try_into().ok()?) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return None;
    }
    let payload = b.get(FRAME_BYTES..FRAME_BYTES + len)?;
    let sum = u64::from_le_bytes(frame[4..].try_into().ok()?);
    if frame_sum(&frame[..4], payload) != sum {
        return None;
    }
    Some((decode(payload)?, FRAME_BYTES + len))
}

/// A snapshot of `entries` (with the shard each belongs to): the header and one `Add` each.
pub fn snapshot<'a>(capacity: u64, entries: impl IntoIterator<Item = &'a Live>) -> Vec<u8> {
    let mut out = header(capacity).to_vec();
    for l in entries {
        encode(
            &Record::Add {
                shard: l.shard,
                entry: l.entry.clone(),
            },
            &mut out,
        );
    }
    out
}

/// Replaces the journal at `path` with `bytes` atomically (written to a file beside it,
/// synced, renamed over it, the directory synced) and opens it for appending. Blocking: the
/// start-up thread, a local service's agent, or the journal's thread, never a shard.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<std::fs::File> {
    let tmp = {
        let mut p = path.as_os_str().to_owned();
        p.push(".tmp");
        PathBuf::from(p)
    };
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        // The rename is durable once the directory is (best effort: not every file system
        // lets a directory be opened for it).
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    std::fs::OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, offset: u64, len: u64, seq: u64) -> Entry {
        Entry {
            key: key.as_bytes().into(),
            medium: Medium::Ssd,
            offset,
            len,
            size: len - 100,
            stamp: Stamp { view: 0, seq },
            sum: seq.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        }
    }

    fn add(shard: u16, key: &str, offset: u64, seq: u64) -> Record {
        Record::Add {
            shard,
            entry: entry(key, offset, 8192, seq),
        }
    }

    fn journal(records: &[Record]) -> Vec<u8> {
        let mut b = header(1 << 30).to_vec();
        for r in records {
            encode(r, &mut b);
        }
        b
    }

    fn keys(r: &Replayed) -> Vec<String> {
        r.entries
            .values()
            .map(|l| String::from_utf8(l.entry.key.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn records_round_trip_and_replay_applies_them_in_order() {
        let recs = vec![
            add(0, "a", 0, 1),
            add(1, "b", 8192, 2),
            add(0, "c", 16384, 3),
            Record::Remove {
                shard: 0,
                offset: 0,
                stamp: Stamp { view: 0, seq: 1 },
            },
            // A removal whose stamp is not the entry's (the range was reused) is ignored.
            Record::Remove {
                shard: 1,
                offset: 8192,
                stamp: Stamp { view: 0, seq: 99 },
            },
        ];
        let b = journal(&recs);
        let r = replay(&b);
        assert_eq!(r.capacity, Some(1 << 30));
        assert_eq!(r.records, 5);
        assert_eq!(r.tail_bytes, 0);
        assert_eq!(keys(&r), ["b", "c"]);
        assert_eq!(r.entries[&8192].entry, entry("b", 8192, 8192, 2));
        assert_eq!(r.entries[&8192].shard, 1);
        // Every record decodes to itself.
        for rec in &recs {
            let mut one = Vec::new();
            encode(rec, &mut one);
            assert_eq!(next_record(&one), Some((rec.clone(), one.len())));
        }
    }

    #[test]
    fn an_add_replaces_the_entries_it_overlaps_and_a_clear_only_its_shards() {
        let b = journal(&[
            add(0, "a", 0, 1),
            add(0, "b", 8192, 2),
            add(1, "c", 16384, 3),
            // Reuses the end of a and the start of b.
            Record::Add {
                shard: 1,
                entry: entry("d", 4096, 8192, 4),
            },
            // A late removal of b (its record came after the reuse) changes nothing.
            Record::Remove {
                shard: 0,
                offset: 8192,
                stamp: Stamp { view: 0, seq: 2 },
            },
            add(0, "e", 65536, 5),
            Record::Clear { shard: 0 },
            add(0, "f", 1 << 20, 6),
        ]);
        let r = replay(&b);
        assert_eq!(keys(&r), ["d", "c", "f"]);
    }

    /// A crash at any byte leaves a prefix: replaying it gives what the intact records say,
    /// and the rest is counted as the tail.
    #[test]
    fn a_torn_tail_leaves_the_records_before_it() {
        let recs: Vec<Record> = (0..20)
            .map(|i| add(0, &format!("k{i}"), i * 8192, i))
            .collect();
        let full = journal(&recs);
        let mut ends = vec![HEADER_BYTES];
        for r in &recs {
            let mut one = Vec::new();
            encode(r, &mut one);
            ends.push(ends.last().unwrap() + one.len());
        }
        for cut in 0..=full.len() {
            let r = replay(&full[..cut]);
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            if cut < HEADER_BYTES {
                assert_eq!((r.capacity, r.entries.len()), (None, 0), "cut {cut}");
                continue;
            }
            assert_eq!(r.entries.len(), whole - 1, "cut {cut}");
            assert_eq!(r.tail_bytes as usize, cut - ends[whole - 1], "cut {cut}");
        }
    }

    /// A damaged byte anywhere in a record ends the replay at that record; a damaged header
    /// yields nothing; random bytes never panic.
    #[test]
    fn a_corrupted_record_ends_the_replay_there() {
        let recs: Vec<Record> = (0..10)
            .map(|i| add(0, &format!("k{i}"), i * 8192, i))
            .collect();
        let full = journal(&recs);
        let mut one = Vec::new();
        encode(&recs[0], &mut one);
        let rec_len = one.len();
        for i in 0..full.len() {
            let mut b = full.clone();
            b[i] ^= 0x40;
            let r = replay(&b);
            if i < HEADER_BYTES {
                assert!(r.entries.is_empty(), "byte {i}");
                continue;
            }
            let damaged = (i - HEADER_BYTES) / rec_len;
            assert_eq!(r.entries.len(), damaged, "byte {i}");
            assert_eq!(r.records as usize, damaged);
        }
        let mut seed = 7u64;
        for n in 0..2000 {
            let mut b = header(4096).to_vec();
            for _ in 0..(n % 300) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b.push(seed as u8);
            }
            let _ = replay(&b);
        }
        // A length past the limit is damage, not a record to wait for.
        let mut b = header(4096).to_vec();
        b.extend_from_slice(&(u32::MAX).to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        assert_eq!(replay(&b).tail_bytes, 12);
    }

    #[test]
    fn a_snapshot_replays_to_the_same_entries_and_replaces_the_file() {
        let mut recs: Vec<Record> = (0..50)
            .map(|i| add((i % 3) as u16, &format!("k{i}"), i * 8192, i))
            .collect();
        for i in (0..50).step_by(2) {
            recs.push(Record::Remove {
                shard: 0,
                offset: i * 8192,
                stamp: Stamp { view: 0, seq: i },
            });
        }
        let r = replay(&journal(&recs));
        assert_eq!(r.entries.len(), 25);
        let snap = snapshot(1 << 30, r.entries.values());
        assert!(snap.len() < journal(&recs).len());
        let again = replay(&snap);
        assert_eq!(again.entries, r.entries);
        assert_eq!(again.records, 25);
        let dir = std::env::temp_dir().join(format!("mmc-journal-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = path_for(&dir.join("mmc-rank-0.ssd"));
        assert!(path.to_str().unwrap().ends_with("mmc-rank-0.ssd.journal"));
        std::fs::write(&path, b"old contents").unwrap();
        let mut f = replace(&path, &snap).unwrap();
        let mut more = Vec::new();
        encode(&Record::Clear { shard: 1 }, &mut more);
        f.write_all(&more).unwrap();
        let back = replay(&std::fs::read(&path).unwrap());
        assert_eq!(
            back.entries.len(),
            25 - r.entries.values().filter(|l| l.shard == 1).count()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
