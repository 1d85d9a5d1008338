//! Stores for tests: the one builder the store's unit tests (`tests.rs`) and the seeded
//! simulation (`sim.rs`) make their stores with.

use super::*;

/// A store of shard 0 of one, over the segments added with [`TestStore::segment`], with
/// the configuration tests share unless they change it.
pub(super) struct TestStore {
    segments: Vec<(u32, Medium, u64)>,
    /// Segments of remote ranks (their bytes on a local service that tests never reach).
    remote: Vec<(u32, Medium, u64)>,
    ssd_dir: Option<String>,
    /// A journaled SSD segment of rank 0: its directory, size and journals.
    journaled: Option<(String, u64, Arc<ssd::journaling::Journals>)>,
    cfg: StoreConfig,
}

impl TestStore {
    pub(super) fn new() -> TestStore {
        TestStore {
            segments: Vec::new(),
            remote: Vec::new(),
            ssd_dir: None,
            journaled: None,
            cfg: StoreConfig {
                keep_tombstones: true,
                lease_ms: 2000,
                high_percent: 90,
                low_percent: 80,
                alloc_timeout_ms: 30_000,
                remote_writer_ms: 22_250,
                rereplicate: RereplicateLimits {
                    concurrency: 4,
                    bytes_per_sec: 0,
                    queue: 1024,
                },
                key_format: Default::default(),
            },
        }
    }

    /// Mounts a segment of `size` bytes (runs of 1 MiB).
    pub(super) fn segment(mut self, rank: u32, medium: Medium, size: u64) -> TestStore {
        self.segments.push((rank, medium, size));
        self
    }

    /// Mounts a remote rank's segment of `size` bytes (runs of 1 MiB).
    pub(super) fn remote_segment(mut self, rank: u32, medium: Medium, size: u64) -> TestStore {
        self.remote.push((rank, medium, size));
        self
    }

    /// Where SSD segments keep their files.
    pub(super) fn ssd_dir(mut self, dir: &str) -> TestStore {
        self.ssd_dir = Some(dir.to_string());
        self
    }

    /// Mounts rank 0's SSD segment of `size` bytes over the file in `dir`, journaled in
    /// `journals` (what its journal lists waits in the file: `SsdFile::take_recovered`).
    pub(super) fn journaled_ssd(
        mut self,
        dir: &std::path::Path,
        size: u64,
        journals: &Arc<ssd::journaling::Journals>,
    ) -> TestStore {
        let dir = dir.to_str().expect("a UTF-8 directory").to_string();
        self.journaled = Some((dir, size, journals.clone()));
        self
    }

    /// A DRAM segment of rank 0.
    pub(super) fn dram(self, size: u64) -> TestStore {
        self.segment(0, Medium::Dram, size)
    }

    pub(super) fn config(mut self, f: impl FnOnce(&mut StoreConfig)) -> TestStore {
        f(&mut self.cfg);
        self
    }

    pub(super) fn build(self) -> Store {
        let table = Arc::new(SegmentTable::default());
        for (rank, medium, size) in self.segments {
            let seg = mount::build_segment(
                &table,
                rank,
                medium,
                size,
                self.ssd_dir.as_deref(),
                1,
                1 << 20,
            )
            .expect("a segment");
            table.insert(seg).expect("mounted");
        }
        if let Some((dir, size, journals)) = self.journaled {
            let file =
                ssd::recover::open(&dir, 0, size, 1, &journals, &|_| 0).expect("an SSD file");
            let seg = mount::ssd_segment(&table, 0, size, file, 1, 1 << 20);
            table.insert(seg).expect("mounted");
        }
        for (rank, medium, size) in self.remote {
            let backend = segment::Backend::Remote(remote::RemoteRank::new(
                "http://127.0.0.1:9".to_string(),
                crate::grant::GrantKey::random(),
                1,
            ));
            let seg = mount::build_remote_segment(&table, rank, medium, size, backend, 1, 1 << 20)
                .expect("a remote segment");
            table.insert(seg).expect("mounted");
        }
        let stats = Arc::new(StoreStats::default());
        Store::new(0, self.cfg, table, stats, Arc::default(), Clock::start())
    }
}
