//! Storage media and their names. Every spelling of a medium the server reads or writes is one
//! column of [`NAMES`], so a name is written once and parsing accepts exactly what is written.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Medium {
    Hbm = 0,
    Dram = 1,
    Ssd = 2,
}

/// How one medium is spelled in each place the server reads or writes it.
#[derive(Debug)]
pub struct MediumNames {
    /// JSON bodies and `Display` (`HBM`).
    pub upper: &'static str,
    /// Segment ids and metric labels (`hbm`).
    pub lower: &'static str,
    /// vLLM's KV-event `medium` field, what KV-aware routers accept (`GPU`).
    pub kv_event: &'static str,
    /// SGLang's KV-event `medium` field (its `StorageMedium`: `GPU`, `CPU_PINNED`, `DISK`).
    pub sglang_kv_event: &'static str,
    /// The device kind in the contract's capacity report (`npu`, `cpu`; SSD has none).
    pub device: Option<&'static str>,
    /// The LMCache backend that keeps blocks on this medium (`LocalGPUBackend`), accepted as
    /// a location by `/memory/evict`.
    pub lmcache_backend: &'static str,
}

/// The names of each medium, indexed by `Medium as usize`.
pub const NAMES: [MediumNames; 3] = [
    MediumNames {
        upper: "HBM",
        lower: "hbm",
        kv_event: "GPU",
        sglang_kv_event: "GPU",
        device: Some("npu"),
        lmcache_backend: "LocalGPUBackend",
    },
    MediumNames {
        upper: "DRAM",
        lower: "dram",
        kv_event: "CPU",
        sglang_kv_event: "CPU_PINNED",
        device: Some("cpu"),
        lmcache_backend: "LocalCPUBackend",
    },
    MediumNames {
        upper: "SSD",
        lower: "ssd",
        kv_event: "DISK",
        sglang_kv_event: "DISK",
        device: None,
        lmcache_backend: "LocalDiskBackend",
    },
];

impl Medium {
    pub const ALL: [Medium; 3] = [Medium::Hbm, Medium::Dram, Medium::Ssd];

    pub const fn names(self) -> &'static MediumNames {
        &NAMES[self as usize]
    }

    /// Upper case, as in JSON bodies (`HBM`).
    pub const fn upper(self) -> &'static str {
        self.names().upper
    }

    /// Lower case, as in segment ids and metric labels (`hbm`).
    pub const fn lower(self) -> &'static str {
        self.names().lower
    }

    /// The name in vLLM's KV events (`GPU`, `CPU`, `DISK`).
    pub const fn kv_event(self) -> &'static str {
        self.names().kv_event
    }

    /// The name in SGLang's KV events (`GPU`, `CPU_PINNED`, `DISK`).
    pub const fn sglang_kv_event(self) -> &'static str {
        self.names().sglang_kv_event
    }

    /// Any of the medium's names but the LMCache backend's, in any case: `hbm`, `npu`, `GPU`,
    /// `dram`, `cpu`, `ssd`, `disk`.
    pub fn parse(s: &str) -> Option<Medium> {
        Medium::ALL.into_iter().find(|m| {
            let n = m.names();
            [Some(n.lower), Some(n.kv_event), n.device]
                .into_iter()
                .flatten()
                .any(|name| name.eq_ignore_ascii_case(s))
        })
    }

    /// The medium an LMCache backend name (exact case) stands for.
    pub fn from_lmcache_backend(s: &str) -> Option<Medium> {
        Medium::ALL
            .into_iter()
            .find(|m| m.names().lmcache_backend == s)
    }

    /// The tier eviction moves blobs down to.
    pub fn lower_tier(self) -> Option<Medium> {
        match self {
            Medium::Hbm => Some(Medium::Dram),
            Medium::Dram => Some(Medium::Ssd),
            Medium::Ssd => None,
        }
    }

    pub fn is_memory(self) -> bool {
        self != Medium::Ssd
    }
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.upper())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_indexed_by_medium() {
        for m in Medium::ALL {
            assert_eq!(NAMES[m as usize].upper.to_ascii_lowercase(), m.lower());
        }
    }

    #[test]
    fn parse_accepts_every_written_name_and_nothing_else() {
        for (s, m) in [
            ("hbm", Medium::Hbm),
            ("HBM", Medium::Hbm),
            ("npu", Medium::Hbm),
            ("GPU", Medium::Hbm),
            ("gpu", Medium::Hbm),
            ("DRAM", Medium::Dram),
            ("cpu", Medium::Dram),
            ("CPU", Medium::Dram),
            ("ssd", Medium::Ssd),
            ("DISK", Medium::Ssd),
        ] {
            assert_eq!(Medium::parse(s), Some(m), "{s}");
        }
        for s in ["", "hb", "LocalCPUBackend", "nvme", "dram "] {
            assert_eq!(Medium::parse(s), None, "{s:?}");
        }
        for m in Medium::ALL {
            assert_eq!(Medium::parse(m.upper()), Some(m));
            assert_eq!(Medium::parse(m.kv_event()), Some(m));
        }
    }

    #[test]
    fn lmcache_backends_match_exactly() {
        assert_eq!(
            Medium::from_lmcache_backend("LocalCPUBackend"),
            Some(Medium::Dram)
        );
        assert_eq!(
            Medium::from_lmcache_backend("LocalDiskBackend"),
            Some(Medium::Ssd)
        );
        assert_eq!(
            Medium::from_lmcache_backend("LocalGPUBackend"),
            Some(Medium::Hbm)
        );
        assert_eq!(Medium::from_lmcache_backend("localcpubackend"), None);
        assert_eq!(Medium::Hbm.lower_tier(), Some(Medium::Dram));
        assert_eq!(Medium::Ssd.lower_tier(), None);
    }
}
