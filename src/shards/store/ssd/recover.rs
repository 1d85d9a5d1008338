//! Opening an SSD file at start with what it held: the data file is kept (not emptied), its
//! journal replayed (`journal.rs`), every entry checked against the file and the segment, and
//! the journal rewritten at once as a snapshot of what is taken, each entry tagged with its
//! owner shard in this process (a `Clear` of this run then names the right entries). The
//! entries go to their owner shards, which index them before the server accepts
//! (`Store::recover`) and read every one back in the background to check its bytes against
//! its checksum (`Store::start_verify`); every read of an SSD copy is checked anyway, so a
//! blob whose bytes do not match is never served, recovered or not.
//!
//! Runs on the start-up thread (or a local service's agent): blocking file I/O, never a shard.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::SsdFile;
use super::journal::{self, Live};
use super::journaling::Journals;
use crate::cluster::catalog::Entry;
use crate::common::segment::PAGE_BYTES;

/// Why a journal entry is not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its bytes are not all in the file (truncated), or it lies outside the segment.
    Length,
    /// Malformed: a range not on pages, a size past its range, a key not valid, a key twice.
    Invalid,
}

/// Checks one replayed entry against the segment's `capacity` and the data file's length
/// (before it is sized to the segment again).
pub fn check(e: &Entry, capacity: u64, file_len: u64) -> Result<(), Refusal> {
    if e.len == 0 || e.len % PAGE_BYTES != 0 || e.offset % PAGE_BYTES != 0 || e.size > e.len {
        return Err(Refusal::Invalid);
    }
    if super::super::keys::validate(&e.key).is_err() {
        return Err(Refusal::Invalid);
    }
    let end = e.offset.checked_add(e.len).ok_or(Refusal::Length)?;
    if end > capacity || e.offset + e.size > file_len {
        return Err(Refusal::Length);
    }
    Ok(())
}

/// Opens (or creates) rank `rank`'s file in `dir` with its journal; `owner` maps a key to its
/// shard among `shards`. What the journal lists and the file holds waits in the file for its
/// shards ([`SsdFile::take_recovered`]); the rest is counted in the file's
/// [`super::RecoveryFigures`].
pub fn open(
    dir: &str,
    rank: u32,
    capacity: u64,
    shards: usize,
    journals: &Arc<Journals>,
    owner: &dyn Fn(&[u8]) -> usize,
) -> io::Result<SsdFile> {
    let started = Instant::now();
    let (path, file) = SsdFile::open_locked(dir, rank, capacity)?;
    let file_len = file.metadata()?.len();
    let jpath = journal::path_for(&path);
    let replayed = match std::fs::read(&jpath) {
        Ok(bytes) => journal::replay(&bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => journal::Replayed::default(),
        Err(e) => return Err(e),
    };
    let (mut length, mut invalid) = (0u64, 0u64);
    let mut live: Vec<Live> = Vec::with_capacity(replayed.entries.len());
    let mut keys = std::collections::HashSet::new();
    for (_, l) in replayed.entries {
        match check(&l.entry, capacity, file_len) {
            Ok(()) if keys.insert(l.entry.key.clone()) => {
                let shard = owner(&l.entry.key) as u16;
                live.push(Live {
                    shard,
                    entry: l.entry,
                });
            }
            // One object has one SSD copy: a key twice is a journal this version did not write.
            Ok(()) => invalid += 1,
            Err(Refusal::Length) => length += 1,
            Err(Refusal::Invalid) => invalid += 1,
        }
    }
    if live.is_empty() {
        // Nothing to keep: the file starts as a fresh sparse file (no stale blocks).
        file.set_len(0)?;
    }
    file.set_len(capacity)?;
    let snap = journal::snapshot(capacity, live.iter());
    let jfile = journal::replace(&jpath, &snap)?;
    let link = journals.register(jpath, capacity, jfile, snap.len() as u64)?;
    let mut ssd = SsdFile::with_file(path, dir, file, capacity, shards);
    ssd.journal = Some(link);
    let r = &ssd.recovery;
    r.dropped_length.add(length);
    r.dropped_invalid.add(invalid);
    r.journal_tail_bytes.add(replayed.tail_bytes);
    r.open_micros.set(started.elapsed().as_micros() as u64);
    let bytes: u64 = live.iter().map(|l| l.entry.size).sum();
    log::info!(
        "{}: its journal lists {} blobs ({bytes} bytes) to recover, read in {:.1} ms{}{}",
        ssd.path.display(),
        live.len(),
        started.elapsed().as_secs_f64() * 1e3,
        if length + invalid > 0 {
            format!(
                "; {} dropped ({length} past the end of the file or the segment, {invalid} malformed)",
                length + invalid
            )
        } else {
            String::new()
        },
        if replayed.tail_bytes > 0 {
            format!(
                "; the last {} bytes of the journal were not intact records (a write cut short) and were ignored",
                replayed.tail_bytes
            )
        } else {
            String::new()
        },
    );
    let mut by_shard: Vec<Vec<Entry>> = (0..shards.max(1)).map(|_| Vec::new()).collect();
    for l in live {
        by_shard[l.shard as usize].push(l.entry);
    }
    *ssd.recovered.lock().unwrap_or_else(|p| p.into_inner()) = by_shard;
    Ok(ssd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::catalog::Stamp;
    use crate::common::medium::Medium;
    use journal::Record;

    fn entry(key: &str, offset: u64, size: u64) -> Entry {
        Entry {
            key: key.as_bytes().into(),
            medium: Medium::Ssd,
            offset,
            len: size.div_ceil(PAGE_BYTES).max(1) * PAGE_BYTES,
            size,
            stamp: Stamp {
                view: 0,
                seq: offset + 1,
            },
            sum: 7,
        }
    }

    #[test]
    fn entries_are_checked_against_the_file_and_the_segment() {
        let cap = 1 << 20;
        assert_eq!(check(&entry("a", 0, 100), cap, cap), Ok(()));
        assert_eq!(check(&entry("a", 0, 100), cap, 99), Err(Refusal::Length));
        assert_eq!(check(&entry("a", cap, 100), cap, cap), Err(Refusal::Length));
        assert_eq!(
            check(&entry("a", u64::MAX - 4095, 100), cap, cap),
            Err(Refusal::Length)
        );
        let mut e = entry("a", 0, 100);
        e.size = e.len + 1;
        assert_eq!(check(&e, cap, cap), Err(Refusal::Invalid));
        assert_eq!(
            check(&entry("a", 100, 100), cap, cap),
            Err(Refusal::Invalid)
        );
        assert_eq!(
            check(&entry("a\nb", 0, 100), cap, cap),
            Err(Refusal::Invalid)
        );
    }

    /// A start on a path with a journal: the entries whose bytes the file holds come back, by
    /// owner shard; the journal is rewritten as their snapshot; a truncated file loses what
    /// lay past its end; a second open of the same file is refused while the first holds it.
    #[test]
    fn an_open_recovers_what_the_journal_lists_and_the_file_holds() {
        let dir = std::env::temp_dir().join(format!("mmc-recover-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_str().unwrap();
        let cap = 1 << 20;
        let data = SsdFile::path_in(d, 2);
        std::fs::write(&data, vec![1u8; 64 << 10]).unwrap();
        let mut j = journal::header(cap).to_vec();
        for (i, e) in [
            entry("k0", 0, 5000),
            entry("k1", 8192, 4096),
            entry("past-the-end", 60 << 10, 8192),
            entry("k0", 32 << 10, 100),
        ]
        .into_iter()
        .enumerate()
        {
            journal::encode(
                &Record::Add {
                    shard: i as u16,
                    entry: e,
                },
                &mut j,
            );
        }
        // A torn last record.
        j.extend_from_slice(&[9, 0, 0]);
        std::fs::write(journal::path_for(&data), &j).unwrap();
        let journals = Journals::new(3);
        let owner = |k: &[u8]| (k[1] - b'0') as usize % 2;
        let f = open(d, 2, cap, 2, &journals, &owner).unwrap();
        let (s0, s1) = (f.take_recovered(0), f.take_recovered(1));
        assert_eq!(s0.iter().map(|e| &*e.key).collect::<Vec<_>>(), [b"k0"]);
        assert_eq!(s0[0].offset, 0, "the first of a key twice is kept");
        assert_eq!(s1.iter().map(|e| &*e.key).collect::<Vec<_>>(), [b"k1"]);
        assert!(f.take_recovered(0).is_empty(), "taken once");
        assert_eq!(f.recovery.dropped_length.get(), 1);
        assert_eq!(f.recovery.dropped_invalid.get(), 1);
        assert_eq!(f.recovery.journal_tail_bytes.get(), 3);
        assert_eq!(
            std::fs::metadata(&data).unwrap().len(),
            cap,
            "sized to the segment"
        );
        assert_eq!(
            std::fs::read(&data).unwrap()[..4],
            [1, 1, 1, 1],
            "the bytes are kept"
        );
        let again = journal::replay(&std::fs::read(journal::path_for(&data)).unwrap());
        assert_eq!(again.entries.len(), 2);
        assert_eq!(again.tail_bytes, 0);
        assert!(
            again
                .entries
                .values()
                .all(|l| l.shard as usize == owner(&l.entry.key))
        );
        let Err(e) = open(d, 2, cap, 2, &journals, &owner) else {
            panic!("a second open of a held file")
        };
        assert!(e.to_string().contains("in use by another process"), "{e}");
        drop(f);
        // Created empty (recovery off): the journal goes, the bytes too.
        let fresh = SsdFile::create(d, 2, cap, 1).unwrap();
        assert!(!journal::path_for(&data).exists());
        assert_eq!(std::fs::read(&data).unwrap()[..4], [0, 0, 0, 0]);
        drop(fresh);
        journals.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
